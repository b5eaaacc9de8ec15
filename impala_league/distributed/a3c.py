"""A3C baseline (Mnih et al. 2016, "Asynchronous Methods for Deep RL", Algorithm S3), the architecture
IMPALA is measured against (Espeholt et al. 2018, Table 1).

Workers act like IMPALA actors (`A3CWorker` is an `Actor`; only `send` differs): each finished batch
of on-policy unrolls becomes an n-step advantage actor-critic gradient, computed on the worker's own
copy of the network, pushed as safetensors bytes to the stream `{run}:grads`, after which the worker
pulls the latest weights. The `ParameterServer` is a `Learner` whose update applies one pushed
gradient with the learner's optimizer (same clipping, same settings) and publishes the weights; it
keeps the learner's checkpoints, metrics, lease and stream delivery. Select with `learner.algo=a3c`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import msgpack
import numpy as np
import torch
from safetensors import SafetensorError

from impala_league.agents.core import forward_batch
from impala_league.agents.heads import DiscreteHead
from impala_league.batch import Batch
from impala_league.config import Config
from impala_league.distributed.actor import Actor
from impala_league.distributed.learner.augmentation import mirrored
from impala_league.distributed.learner.ingest import Ingest
from impala_league.distributed.learner.role import Learner
from impala_league.distributed.learner.update import optimizer_step
from impala_league.distributed.wire.codec import DecodeError, decode_weights, encode_weights, unpack_message
from impala_league.distributed.wire.transport import TrajectoryStream
from impala_league.league.opponents import BotFactory
from impala_league.league.players import MAIN, namespace
from impala_league.losses.actor_critic import actor_critic_loss

GRADIENTS = "grads"  # stream `{run}:grads`
SCHEMA = 1
STAT_NAMES = ("loss", "policy_gradient_loss", "baseline_loss", "entropy", "mean_rho", "rho_clipped_fraction",
              "c_clipped_fraction")


def encode_gradients(model: torch.nn.Module, *, policy_version: int, actor_id: int, agent_steps: int,
                     stats: dict[str, float]) -> bytes:
    """One worker's gradient for XADD: msgpack {"header": {...}, "grads": safetensors bytes}.

    grads holds each parameter's .grad (float32, the parameter's shape; zeros where it has none),
    named as in `model.named_parameters()`. header: `schema`, `policy_version` (the weights the
    gradient was computed with), `actor_id`, `agent_steps` (the agent steps it covers) and `stats` (loss parts,
    floats named as in STAT_NAMES).
    """
    grads = {name: (p.grad if p.grad is not None else torch.zeros_like(p)).float()
             for name, p in model.named_parameters()}
    header = {"schema": SCHEMA, "policy_version": int(policy_version), "actor_id": int(actor_id),
              "agent_steps": int(agent_steps), "stats": {k: float(stats[k]) for k in STAT_NAMES}}
    return msgpack.packb({"header": header, "grads": encode_weights(grads)}, use_bin_type=True)


def decode_gradients(data: bytes, shapes: dict[str, tuple[int, ...]]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Parse and validate one pushed gradient against the parameter shapes `shapes` (name -> shape).

    Returns (header, grads) with grads float32 tensors of exactly those names and shapes.
    Raises DecodeError, with the reason, for anything else (no pickle is ever involved: msgpack
    and safetensors only).
    """
    msg = unpack_message(data, ("header", "grads"), "gradient message")
    header = msg["header"]
    if not isinstance(header, dict) or header.get("schema") != SCHEMA:
        raise DecodeError(f"gradient header must be a map with schema {SCHEMA}")
    for key in ("policy_version", "actor_id", "agent_steps"):
        if not isinstance(header.get(key), int) or isinstance(header.get(key), bool) or header[key] < -1:
            raise DecodeError(f"gradient header field {key!r} must be an integer >= -1")
    stats = header.get("stats")
    if (not isinstance(stats, dict) or set(stats) != set(STAT_NAMES)
            or not all(isinstance(v, float) and math.isfinite(v) for v in stats.values())):
        raise DecodeError(f"gradient header 'stats' must map exactly {list(STAT_NAMES)} to finite floats")
    if not isinstance(msg["grads"], bytes):
        raise DecodeError("'grads' must be safetensors bytes")
    try:
        grads = decode_weights(msg["grads"])
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise DecodeError(f"'grads' is not valid safetensors: {e}".splitlines()[0]) from None
    if set(grads) != set(shapes):
        raise DecodeError(f"gradient names differ from the network's parameters: got {sorted(grads)[:5]}...")
    for name, g in grads.items():
        if g.dtype != torch.float32 or tuple(g.shape) != tuple(shapes[name]):
            raise DecodeError(f"gradient {name!r} must be float32 {tuple(shapes[name])}, got {g.dtype} {tuple(g.shape)}")
        if not bool(torch.isfinite(g).all()):
            raise DecodeError(f"gradient {name!r} holds nan or inf")
    return header, grads


def apply_gradients(model: torch.nn.Module, optimizer: torch.optim.Optimizer, grads: dict[str, torch.Tensor],
                    cfg) -> dict[str, float]:
    """Set each parameter's .grad from `grads` (name -> tensor) and take the learner's optimizer step
    (`optimizer_step`: global-norm clip at cfg.grad_norm_clip). Returns grad_norm and skipped_update."""
    optimizer.zero_grad(set_to_none=True)
    for name, p in model.named_parameters():
        p.grad = grads[name].to(p.device)
    return optimizer_step(model, optimizer, cfg)


class A3CWorker(Actor):
    """An actor that learns on its own: every batch of finished unrolls becomes a gradient push.

    The loss is `actor_critic_loss` with correction `none` (n-step returns, advantage R_t - V(x_t)),
    on unrolls the worker's current weights just produced (on-policy, up to `actor.epsilon`).
    """

    def __init__(self, cfg: Config, redis_url: str, actor_id: int | None = None, player: str = MAIN,
                 bots: BotFactory | None = None):
        super().__init__(cfg, redis_url, actor_id, player, bots)
        self.gradients = TrajectoryStream(self.redis, namespace(cfg.run.name, player), GRADIENTS)
        self.loss_cfg = dataclasses.replace(cfg.learner, correction="none")
        self.gradients_sent = 0
        # A worker's batch is its own few unrolls: it trains on both orientations of each (`random` too).
        self.mirror = cfg.learner.mirror_augment != "none" and self.spec.mirror_actions is not None

    def send(self, unrolls: list[dict[str, np.ndarray]], versions: list[int] | None = None) -> bool:
        """Compute and push the gradient of `unrolls`, then pull the latest weights. True = run is over.
        The gradient is that of the weights held now, so it is stamped with their version, not `versions`."""
        self.gradients.wait_for_room(self.cfg.actor.high_water_mark, self.run_over, backlog=self.counters.backlog)
        if self.run_over():
            return True
        batch = Batch.stack(unrolls, torch.device("cpu"))
        if self.mirror:
            batch = mirrored(batch, self.spec)
        self.policy.model.zero_grad(set_to_none=True)
        loss, parts = actor_critic_loss(*forward_batch(self.policy.model, batch), batch, self.loss_cfg, DiscreteHead())
        loss.backward()
        self.gradients_sent += 1  # the stream's `produced` counts gradients, as the parameter server's acks do
        self.counters.backlog = self.gradients.add([encode_gradients(
            self.policy.model, policy_version=self.policy.version, actor_id=self.actor_id,
            agent_steps=self.cfg.actor.unroll_length * len(unrolls), stats={k: float(v) for k, v in parts.items()})],
            producer=f"{self.actor_id}-{self.token}", produced=self.gradients_sent, env_steps=self.counters.env_steps)
        self.counters.sent += len(unrolls)
        self.sync_params()
        self.refresh_opponents()
        return False


class GradientIngest(Ingest):
    """The parameter server's reads: the gradients workers push to `{run}:grads`, one per update, each
    checked against the network's parameter shapes (`shapes`: name -> shape) and applied as it is. The
    `Ingest` of a learner otherwise: in flight until acked, read ahead by the ingest thread."""

    def __init__(self, cfg: Config, gradients: TrajectoryStream, consumer: str, shapes: dict[str, tuple[int, ...]],
                 *, unrolls_left: Callable[[], float], stopping: Callable[[], bool], run_over: Callable[[], bool]):
        super().__init__(cfg, gradients, consumer, fresh=1, unrolls_per_entry=1, unrolls_left=unrolls_left,
                         stopping=stopping, run_over=run_over)
        self.shapes = shapes

    @staticmethod
    def unrolls_in(header: dict) -> int:
        return 1  # one gradient

    def decode(self, entries: list[bytes]) -> list[tuple[dict, tuple[dict, dict[str, torch.Tensor]]] | DecodeError]:
        out: list = []
        for data in entries:
            try:
                header, grads = decode_gradients(data, self.shapes)
                out.append((header, (header, grads)))
            except DecodeError as e:
                out.append(e)
        return out

    def prepare(self, payloads: list) -> list:
        return payloads  # gradients are applied as they are


class ParameterServer(Learner):
    """A `Learner` that applies pushed gradients one at a time instead of learning from unrolls: it reads
    them through its own `make_ingest` (`GradientIngest`) and applies them in its own `train_on`.

    Metrics keep the learner's names: `sps` counts the agent steps behind the applied gradients,
    `policy_lag` is (updates applied) - (version the gradient was computed with), and the loss
    parts are the workers' own.
    """

    role = "parameter server"

    def make_ingest(self, redis_url: str, namespace: str, consumer: str, rank: int) -> Ingest:
        """The gradient stream `{run}:grads`, every gradient applied as soon as it arrives (no replay,
        no ingest workers: config.validate refuses both with learner.algo=a3c)."""
        return GradientIngest(self.cfg, TrajectoryStream(self.redis, namespace, GRADIENTS), consumer,
                              {name: tuple(p.shape) for name, p in self.model.named_parameters()},
                              unrolls_left=self.unrolls_left, stopping=lambda: self.stopping,
                              run_over=self.run_is_over)

    def train_on(self, payloads: list[tuple[dict, dict[str, torch.Tensor]]]) -> dict[str, float]:
        """Apply one gradient; publish the weights on schedule."""
        [(header, grads)] = payloads
        stats = {**header["stats"], **apply_gradients(self.model, self.optimizer, grads, self.cfg.learner)}
        self.step += 1
        self.agent_steps += header["agent_steps"]
        if self.step % self.cfg.learner.publish_every == 0:
            self.params.publish(self.model.state_dict(), self.step, self.agent_steps)
        return stats
