"""Learner process: batches of unrolls from Redis -> V-trace actor-critic update -> published weights.

`learn_step` is the algorithm (IMPALA, Espeholt et al. 2018, sec. 4); `Learner` is the plumbing around
it: reading and decoding the stream, acking, publishing, checkpointing, logging.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import threading
import time
import zlib
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import redis
import torch

from impala_league.agents.core import dead_units, flatten_steps, forward_batch
from impala_league.agents.heads import DiscreteHead, FunctionCallHead
from impala_league.agents.model import make_model, policy_head
from impala_league.agents.redo import recycle_dormant_units
from impala_league.config import Config, ConfigError, LearnerConfig, core_size, replayed_per_batch
from impala_league.distributed.wire import keys
from impala_league.distributed.allocator import keep_freed_memory
from impala_league.distributed.checkpoints import Checkpoints
from impala_league.distributed.wire.codec import DecodeError, UnrollSpec, as_entry, decode_unrolls
from impala_league.distributed.data_parallel import (DataParallelError, Group, average_gradients, average_tensor,
                                                     broadcast_state, cuda_device_for, join)
from impala_league.distributed.ingest import BatchReader, Prefetcher, stack_entries, unstack
from impala_league.distributed.ingest_workers import (IngestWorkerError, IngestWorkers, slot_nbytes, worker_consumer,
                                        worker_settings)
from impala_league.distributed.metrics import LearnerMetrics
from impala_league.distributed.ownership import run_role
from impala_league.distributed.wire.params import ParamStore
from impala_league.distributed.replay import ReplayBuffer
from impala_league.distributed.wire.shards import ShardedTrajectories
from impala_league.distributed.wire.transport import LearnerLease, TrajectoryStream, connect, run_is_over
from impala_league.league.players import MAIN, namespace
from impala_league.league.store import LeagueStore
from impala_league.losses.actor_critic import actor_critic_loss
from impala_league.envs.registry import EnvSpec, env_spec
from impala_league.tracking import Tracker

log = logging.getLogger("learner")



@dataclass
class Batch:
    """B unrolls stacked time-major. obs [T+1, B, *obs_shape]; action_mask [T+1, B, A];
    action [T, B] int64; reward [T, B]; done [T, B] bool; behaviour_logits [T, B, A].

    Time limits (see UnrollSpec): truncated [T, B] bool (done where a time limit cut the episode; None
    = no step truncated); final_obs [N, *obs_shape], the final observation of each truncated step,
    at step (final_t[n], final_b[n]) (int64 [N] each).

    A recurrent core (agents/core.py): core_state [B, 2, core_size], the state each unroll's stream had
    before step 0; last_action int64 [B] and last_reward [B], its action and reward before step 0 (None
    without a core).

    Envs with several observation arrays and multi-head actions (StarCraft II, see UnrollSpec): obs is
    a dict name -> [T+1, B, ...] (final_obs name -> [N, ...]), action [T, B, H], and `behaviour_logits`
    holds the unroll's `behaviour_log_probs`, log mu_h(a_h|x) [T, B, H]: whatever the policy head records
    (agents/heads.py).
    """

    obs: torch.Tensor | dict[str, torch.Tensor]
    action_mask: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    done: torch.Tensor
    behaviour_logits: torch.Tensor
    truncated: torch.Tensor | None = None
    final_obs: torch.Tensor | dict[str, torch.Tensor] | None = None
    final_t: torch.Tensor | None = None
    final_b: torch.Tensor | None = None
    core_state: torch.Tensor | None = None
    last_action: torch.Tensor | None = None
    last_reward: torch.Tensor | None = None

    @classmethod
    def stack(cls, unrolls: list[dict[str, np.ndarray]], device: torch.device, pin: bool = False) -> "Batch":
        """Stack decoded unrolls (UnrollSpec arrays, [T+1, ...]; final observations [N_b, ...]) on
        `device`: `concat` of entries of one unroll each."""
        return cls.concat([as_entry(u) for u in unrolls], device, pin)

    @classmethod
    def concat(cls, entries: list[dict[str, np.ndarray]], device: torch.device, pin: bool = False) -> "Batch":
        """The unrolls of decoded stream entries (codec.decode_unrolls: arrays [n_e, ...], final
        observations [N_e, ...]), one after the other, as one batch on `device`; `pin`: into pinned
        host memory, from which `to` copies to a GPU without blocking."""
        return cls.from_arrays(stack_entries(entries), device, pin)

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], device: torch.device, pin: bool = False) -> "Batch":
        """The batch of `ingest.stack_entries`'s time-major arrays ([T+1, B, ...], final observations
        [N, ...]), sharing their memory on the CPU (unless `pin`: pinned copies)."""
        names = arrays

        def tensor(name: str) -> torch.Tensor:
            return torch.from_numpy(arrays[name])

        obs = tensor("obs") if "obs" in names else {n[4:]: tensor(n) for n in names if n.startswith("obs.")}
        behaviour = tensor("behaviour_logits" if "behaviour_logits" in names else "behaviour_log_probs")
        batch = cls(obs=obs, action_mask=tensor("action_mask"), action=tensor("action"),
                    reward=tensor("reward"), done=tensor("done").bool(), behaviour_logits=behaviour)
        if "truncated" in names:
            batch.truncated = tensor("truncated").bool()
            # final_obs rows are in step order within each unroll, unrolls one after the other: the
            # order of the nonzeros of truncated [B, T].
            final_b, final_t = np.nonzero(arrays["truncated"].T)
            batch.final_t = torch.from_numpy(final_t).long()
            batch.final_b = torch.from_numpy(final_b).long()
            batch.final_obs = final_observations(obs, tensor, names)
        if "core_state" in names:  # [1, B, ...]: one row, before step 0
            batch.core_state, batch.last_action, batch.last_reward = (
                tensor(name)[0] for name in ("core_state", "last_action", "last_reward"))
        return batch.map(torch.Tensor.pin_memory) if pin else batch.to(device)

    def to(self, device: torch.device) -> "Batch":
        """This batch on `device` (copies from pinned memory do not block the host); itself if it is there."""
        if self.reward.device == device:  # (a dozen no-op calls cost a tenth of a millisecond a batch)
            return self
        return self.map(lambda t: t.to(device, non_blocking=True))

    def map(self, fn) -> "Batch":
        """A batch of `fn(tensor)` for every tensor of this one (in dicts too; None stays None)."""
        def apply(x):
            return None if x is None else {k: fn(v) for k, v in x.items()} if isinstance(x, dict) else fn(x)

        return Batch(**{f.name: apply(getattr(self, f.name)) for f in dataclasses.fields(self)})

    def with_mirror(self, spec: EnvSpec) -> "Batch":
        """This batch and its reflection through the board's symmetry, side by side: [.., 2B, ..]."""
        perm = torch.tensor(spec.mirror_actions, device=self.action.device)
        obs_axis = 2 + spec.mirror_axis  # skip the T and B dimensions
        B = self.reward.shape[1]
        mirrored = Batch(
            obs=torch.cat([self.obs, self.obs.flip(obs_axis)], 1),
            action_mask=torch.cat([self.action_mask, self.action_mask[..., perm]], 1),
            action=torch.cat([self.action, perm[self.action]], 1),
            reward=torch.cat([self.reward, self.reward], 1),
            done=torch.cat([self.done, self.done], 1),
            behaviour_logits=torch.cat([self.behaviour_logits, self.behaviour_logits[..., perm]], 1),
        )
        if self.truncated is not None:
            mirrored.truncated = torch.cat([self.truncated, self.truncated], 1)
            mirrored.final_obs = torch.cat([self.final_obs, self.final_obs.flip(1 + spec.mirror_axis)], 0)
            mirrored.final_t = torch.cat([self.final_t, self.final_t])
            mirrored.final_b = torch.cat([self.final_b, self.final_b + B])
        return mirrored

    def with_random_mirror(self, spec: EnvSpec, flip: torch.Tensor) -> "Batch":
        """This batch with unroll b replaced by its reflection where flip[b] (flip [B] bool): the board's
        symmetry as data augmentation at the cost of one batch, where `with_mirror` costs two. Only the
        flipped unrolls (and their final observations) are copied."""
        perm = torch.tensor(spec.mirror_actions, device=self.action.device)
        obs_axis = 2 + spec.mirror_axis  # skip the T and B dimensions

        def reflect(x: torch.Tensor, fn) -> torch.Tensor:
            x = x.clone()
            x[:, flip] = fn(x[:, flip])
            return x

        chosen = dataclasses.replace(
            self, obs=reflect(self.obs, lambda o: o.flip(obs_axis)),
            action_mask=reflect(self.action_mask, lambda m: m[..., perm]),
            action=torch.where(flip, perm[self.action], self.action),
            behaviour_logits=reflect(self.behaviour_logits, lambda b: b[..., perm]))
        if self.truncated is not None:
            rows = flip[self.final_b]  # a final observation is reflected with its own unroll
            chosen.final_obs = self.final_obs.clone()
            chosen.final_obs[rows] = self.final_obs[rows].flip(1 + spec.mirror_axis)
        return chosen


def final_observations(obs: torch.Tensor | dict[str, torch.Tensor], tensor, names) -> torch.Tensor | dict:
    """The final observations of a batch's truncated steps, [N, ...] like one step of `obs` ([T+1, B, ...]
    or a dict of such): `tensor(name)` of the stacked `final_obs` arrays, or none (N = 0) where the
    unrolls carry none (an actor's own buffers leave them out when no step is truncated)."""
    def final(name: str, like: torch.Tensor) -> torch.Tensor:
        return tensor(name) if name in names else like.new_zeros((0, *like.shape[2:]))

    if isinstance(obs, dict):
        return {k: final(f"final_obs.{k}", v) for k, v in obs.items()}
    return final("final_obs", obs)


class Mirror:
    """`learner.mirror_augment` on a board with a mirror symmetry (EnvSpec.mirror_actions; `none` on other
    games), applied to a batch on the learner's `device`: `both` trains on every unroll and its reflection
    ([.., 2B, ..], `Batch.with_mirror`); `random` reflects each unroll with probability 1/2
    (`Batch.with_random_mirror`), drawn from a generator of its own, seeded by `seed` (one stream per
    rank, reproducible from run.seed); `none` leaves the batch as it is."""

    def __init__(self, spec: EnvSpec, mode: str, device: torch.device, seed: int):
        self.spec = spec
        self.mode = mode if spec.mirror_actions is not None else "none"
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def __call__(self, batch: Batch) -> Batch:
        if self.mode == "both":
            return batch.with_mirror(self.spec)
        if self.mode == "random":
            flip = torch.rand(batch.reward.shape[1], generator=self.generator, device=self.device) < 0.5
            return batch.with_random_mirror(self.spec, flip)
        return batch


class Prepared(NamedTuple):
    """What `Learner.train_on` takes: F fresh unrolls from the stream and R from the replay, stacked.

    batch: [.., F + R, ..], the F fresh unrolls first. fresh: the F fresh payloads (decoded arrays), for
    the replay once the update has trained on them; [] without replay. replayed_versions: the
    `policy_version` of each of the R replayed unrolls (R = 0 without replay).
    """

    batch: Batch
    fresh: list[dict[str, np.ndarray]]
    replayed_versions: list[int]


Head = DiscreteHead | FunctionCallHead


def optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: LearnerConfig) -> dict[str, float]:
    """Clip the gradients in `model`'s .grad to global norm `cfg.grad_norm_clip` and step, unless that
    norm is not finite. Returns {"grad_norm": norm before clipping, "skipped_update": 1.0 or 0.0}."""
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_norm_clip)
    # A batch whose loss or gradient is not finite (finite but extreme values that overflow on the way,
    # e.g. rewards near float32's max) would turn every weight into nan for good: skip that update.
    skipped = not bool(torch.isfinite(grad_norm))
    if skipped:
        optimizer.zero_grad(set_to_none=True)
    else:
        optimizer.step()
    return {"grad_norm": float(grad_norm), "skipped_update": float(skipped)}


def learn_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, cfg: LearnerConfig,
               head: Head | None = None,
               reduce_gradients: Callable[[torch.nn.Module], None] | None = None) -> dict[str, float]:
    """One IMPALA update on `batch` (loss: losses.actor_critic.actor_critic_loss; `head` default one
    Discrete action). Returns the losses, grad_norm, skipped_update, the V-trace diagnostics and
    `dead_units` (agents.core.dead_units of the torso's features) as floats, of this batch.

    `reduce_gradients(model)`, with several learners (distributed/data_parallel.py), averages the
    gradients over them between the backward pass and the clip, so the clip and the step see the
    gradient of the union of their batches."""
    features = []
    hook = model.feature_layer().register_forward_hook(lambda _module, _input, out: features.append(out.detach()))
    try:
        loss, parts = actor_critic_loss(*forward_batch(model, batch), batch, cfg, head or DiscreteHead())
    finally:
        hook.remove()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if reduce_gradients is not None:
        reduce_gradients(model)
    step = optimizer_step(model, optimizer, cfg)
    parts["dead_units"] = dead_units(features[0])  # read with the losses: one device-to-host copy
    return {**dict(zip(parts, torch.stack(list(parts.values())).tolist())), **step}


def make_optimizer(model: torch.nn.Module, cfg: LearnerConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "rmsprop":
        return torch.optim.RMSprop(model.parameters(), lr=cfg.learning_rate, alpha=cfg.rmsprop_alpha,
                                   eps=cfg.rmsprop_eps)
    return torch.optim.Adam(model.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps)


def scheduled_learning_rate(cfg: Config, frames: int, elapsed_s: float) -> float:
    """The learning rate for the next update. `linear` anneals `learner.learning_rate` linearly to 0
    (as in the IMPALA experiments, Espeholt et al. 2018) over the run's budget: progress is the larger of
    frames / run.total_agent_steps and elapsed_s / (60 * run.max_minutes), so whichever ends the run first.
    `elapsed_s` is the run's training time so far, as run.max_minutes counts it: a resumed learner starts
    from the seconds its checkpoint recorded, so the schedule and the budget go on where they stopped."""
    lr = cfg.learner.learning_rate
    if cfg.learner.lr_schedule == "constant":
        return lr
    progress = frames / cfg.run.total_agent_steps
    if cfg.run.max_minutes:
        progress = max(progress, elapsed_s / (60 * cfg.run.max_minutes))
    return lr * max(0.0, 1.0 - progress)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ConfigError(f"learner.device={name}: {e}".splitlines()[0]) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"learner.device={name} but CUDA is not available; use learner.device=auto or cpu")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ConfigError(f"learner.device={name} but this machine has {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"learner.device={name} but MPS is not available; use learner.device=auto or cpu")
    return device


def make_replay(cfg: Config, unroll_spec: UnrollSpec, replayed: int, rank: int, player: str) -> ReplayBuffer:
    """The replay of learner `rank` of `player`, seeded by run.seed, its rank and its player (crc32:
    Python's str hash differs between processes). Raises ConfigError when learner.replay_memory_mb cannot
    hold the `replayed` unrolls a batch replays."""
    capacity = int(cfg.learner.replay_memory_mb * 2**20)
    largest = unroll_spec.max_unroll_nbytes
    if capacity < replayed * largest:
        raise ConfigError(f"learner.replay_memory_mb={cfg.learner.replay_memory_mb} holds fewer than the "
                          f"{replayed} unrolls a batch replays (up to {largest / 2**20:.3f} MB each for "
                          f"{unroll_spec.env.name} with T={cfg.actor.unroll_length}): raise it")
    return ReplayBuffer(capacity, seed=(cfg.run.seed, rank, zlib.crc32(player.encode())))


class Ingest:
    """The learner's reads: batches of B unrolls from the trajectory stream, decoded, validated and
    stacked (`Prepared`) for `Learner.train_on`, acked once trained on.

    Owns the stream (`trajectories`: every shard, read and acked as one; ids carry their shard), this
    learner's consumer name in its group and its reader (`reader`: own pending entries first, malformed
    entries dead-lettered), the unrolls in flight (read and not yet acked: `run.total_agent_steps` counts
    them before more are read), what reads ahead of the update (`start`: the ingest thread,
    `learner.prefetch_batches` deep, or `learner.ingest_workers` processes; without either, `get`
    reads in the update's thread), and the replay, whose k unrolls join the F = `batch_size` fresh ones
    of every batch (`replay`, None without one).

    `decode`, `unrolls_in` and `prepare` say what an entry holds and what a batch of them becomes; A3C's
    parameter server reads gradients through them (distributed/a3c.py). What it reads of the learner:
    unrolls_left(), unrolls the run may still take (run.total_agent_steps); stopping(); run_over(), whether
    no more entries will come (an exploiter's run ends with the main agent's).
    """

    def __init__(self, cfg: Config, trajectories: ShardedTrajectories | TrajectoryStream, consumer: str, *,
                 fresh: int, unrolls_per_entry: int, unrolls_left: Callable[[], float], stopping: Callable[[], bool],
                 run_over: Callable[[], bool], unroll_spec: UnrollSpec | None = None,
                 replay: ReplayBuffer | None = None, pin: bool = False, worker_settings: dict | None = None):
        """fresh: F, stream unrolls per batch; unrolls_per_entry: what one entry is expected to hold
        (`actor.send_batch`); unroll_spec: what `decode` checks unrolls against; pin: stack batches in
        pinned memory (the update runs on a GPU); worker_settings: what ingest workers read with
        (`ingest_workers.worker_settings`), None without workers."""
        self.cfg = cfg
        self.trajectories = trajectories
        self.consumer = consumer
        self.batch_size = fresh
        self.unrolls_per_entry = unrolls_per_entry
        self.unrolls_left = unrolls_left
        self.stopping = stopping
        self.unroll_spec = unroll_spec
        self.run_over = run_over
        self.replay = replay
        self.replayed = replayed_per_batch(cfg.learner)  # k, of the replay's unrolls in every batch
        self.pin = pin
        self.worker_settings = worker_settings
        self.reader = BatchReader(trajectories, consumer, self.decode, self.unrolls_in, unrolls_per_entry,
                                  cfg.learner.read_block_ms)
        self.in_flight_unrolls = 0  # of the batches read and not yet acked (with the thread, or none)
        self.in_flight_lock = threading.Lock()
        self.workers: IngestWorkers | None = None  # learner.ingest_workers, started by `start`
        self.ahead: Prefetcher | IngestWorkers | None = None  # what `start` started
        self.held = threading.Event()  # set by `close`: the entries in flight are no longer renewed
        self.reading = True  # cleared by `close`, which ends the ingest thread's reads

    # -- what an entry holds, what a batch becomes -------------------------------------------------
    def decode(self, entries: list[bytes]) -> list[tuple[dict, object] | DecodeError]:
        """(header, payload) of each stream entry, or the DecodeError that rejects it."""
        return decode_unrolls(entries, self.unroll_spec)

    @staticmethod
    def unrolls_in(header: dict) -> int:
        """The unrolls a stream entry with this header holds (counted as trained or duplicate with it)."""
        return header["unrolls"]

    def unroll_versions(self, headers: list[dict]) -> list[int]:
        """The policy version of each unroll of the entries with these headers, in batch order."""
        return [h["policy_version"] for h in headers for _ in range(self.unrolls_in(h))]

    def prepare(self, payloads: list) -> object:
        """What `train_on` takes, made in the ingest thread from the decoded entries read (F fresh
        unrolls in all): a `Prepared` batch of them and k unrolls sampled from the replay (fewer while
        it holds fewer), in pinned memory when the update runs on a GPU."""
        replayed = self.replay.sample(self.replayed) if self.replay is not None else []
        return self.prepared(stack_entries(payloads + [as_entry(r.unroll) for r in replayed]), replayed)

    def prepare_stacked(self, arrays: dict[str, np.ndarray]) -> Prepared:
        """`prepare` for a batch an ingest worker stacked (time-major arrays in its shared-memory slot,
        valid until the batch is acked): the batch shares that memory (pinned copies for a GPU); the
        replayed unrolls, stacked here, are appended to a copy."""
        replayed = self.replay.sample(self.replayed) if self.replay is not None else []
        if replayed:
            more = stack_entries([as_entry(r.unroll) for r in replayed])
            arrays = {name: np.concatenate([a, more[name]], axis=0 if name.startswith("final_obs") else 1)
                      for name, a in arrays.items()}
        return self.prepared(arrays, replayed)

    def prepared(self, arrays: dict[str, np.ndarray], replayed: list) -> Prepared:
        """The `Prepared` batch of time-major arrays whose last len(replayed) unrolls are `replayed`; the
        fresh ones before them (views) go to the replay after the update."""
        batch = Batch.from_arrays(arrays, torch.device("cpu"), pin=self.pin)
        fresh = unstack(arrays, batch.reward.shape[1] - len(replayed)) if self.replay is not None else []
        return Prepared(batch, fresh, [r.policy_version for r in replayed])

    def remember(self, prepared: Prepared, headers: list[dict], stats: dict[str, float], step: int) -> list[int]:
        """Add the fresh unrolls of the update just made (the learner's `step`-th) to the replay; returns
        the policy lag of each unroll it replayed ([] without a replay). A batch whose update was skipped
        (non-finite loss) is not kept: replaying its extreme values would skip later updates too."""
        if self.replay is None:
            return []
        if not stats["skipped_update"]:
            for unroll, version in zip(prepared.fresh, self.unroll_versions(headers), strict=True):
                self.replay.add(unroll, version)
        return [step - 1 - version for version in prepared.replayed_versions]

    # -- reading -----------------------------------------------------------------------------------
    def keep_reading(self) -> bool:
        """False once the learner stops, or once `close` ends the reads."""
        return not self.stopping() and self.reading

    def read(self) -> tuple[list, list[dict], list] | None:
        """Block until entries holding F valid unrolls are read (`BatchReader.read`): their ids, headers
        and payloads (decoded arrays, [n, ...] each, see `decode`). None when stopping, or when
        `run_over()`."""
        return self.reader.read(self.batch_size, self.keep_reading, self.run_over)

    def next_batch(self) -> tuple[list[bytes], list[dict], object] | None:
        """Read, de-duplicate, decode, validate and prepare the next batch (`read`, `prepare`), marking
        it in flight until `acknowledge`. None when stopping.

        It reads nothing while the batches in flight already reach `run.total_agent_steps`, so a run that
        ends there leaves no unroll delivered and unacked."""
        while self.in_flight_unrolls >= self.unrolls_left():
            if not self.keep_reading():
                return None
            time.sleep(0.005)
        got = self.read()
        if got is None:
            return None
        ids, headers, payloads = got
        with self.in_flight_lock:
            self.in_flight_unrolls += sum(map(self.unrolls_in, headers))
        return ids, headers, self.prepare(payloads)

    def claim_stale(self) -> None:
        """Take over the entries a stopped learner of this name left pending (idle a minute), into the
        consumer that reads first: this learner's, or its first ingest worker's."""
        claimed = self.trajectories.claim_stale(worker_consumer(self.consumer, 0) if self.worker_settings
                                                else self.consumer, min_idle_ms=60_000)
        if claimed:
            log.info("claimed %d unrolls left pending by a stopped learner", claimed)

    def start(self) -> Prefetcher | IngestWorkers | None:
        """Start reading ahead of the update: the ingest workers (with worker settings), the ingest
        thread (`learner.prefetch_batches` ahead), or nothing (0: `get` reads in the update's thread).
        Without workers, a thread renews the entries in flight until `close` (workers renew their own)."""
        cfg = self.cfg
        if self.worker_settings is not None:
            self.workers = IngestWorkers(
                self.worker_settings, self.consumer, cfg.learner.ingest_workers, cfg.learner.prefetch_batches,
                self.batch_size, slot_nbytes(self.unroll_spec, self.batch_size), self.unrolls_left,
                self.prepare_stacked, self.keep_reading)
            self.ahead = self.workers
        elif cfg.learner.prefetch_batches:
            self.ahead = Prefetcher(self.next_batch, cfg.learner.prefetch_batches)
        if self.workers is None:
            self.held = threading.Event()
            threading.Thread(target=self.reader.keep_alive, args=(self.held,), name="keep-alive", daemon=True).start()
        return self.ahead

    def get(self) -> tuple[list, list[dict], object] | None:
        """The next batch (ids, headers, prepared): from what `start` started, or read here; None at the end."""
        return self.ahead.get() if self.ahead else self.next_batch()

    def acknowledge(self, ids: list[bytes], headers: list[dict]) -> int | None:
        """Ack a batch the update has trained on, counting its unrolls as trained; returns the stream's
        trained count after it. With ingest workers the worker that read it acks it
        (`IngestWorkers.release`): the learner sends no command, and None is returned."""
        if self.workers is not None:
            self.workers.release(ids)
            return None
        counts = [self.unrolls_in(h) for h in headers]
        trained = self.trajectories.ack(ids, counts)
        self.reader.release(ids)
        with self.in_flight_lock:
            self.in_flight_unrolls -= sum(counts)
        return trained

    def close(self) -> None:
        """Stop reading ahead: what was read and not trained on stays pending, for the next learner."""
        self.held.set()
        self.reading = False  # the ingest thread's read ends
        if self.ahead:
            self.ahead.close()


class Learner:
    """One learner process: the model and its optimizer, and `run`, the loop that trains them until the
    run is done: next batch -> train on it -> acknowledge it -> record it, and a checkpoint when one is due.

    step: updates made; frames: agent steps trained (K x F x T an update with K learners of F fresh unrolls
    of T steps). The loop's helpers: `ingest` (the reads: `Ingest`), `checkpoints` (the checkpoint and the
    run's state it carries: distributed/checkpoints.py), `metrics` (metrics.jsonl and the trackers:
    distributed/metrics.py), `group` (the ranks of several learners: distributed/data_parallel.py),
    `params` (the published weights), `lease` (one learner per run), `mirror` (board augmentation).
    A subclass reads other entries through its own `make_ingest` and trains on them through its own
    `train_on` (A3C's parameter server, distributed/a3c.py).
    """

    role = "learner"  # in log lines (A3C's parameter server is named as such)

    def __init__(self, cfg: Config, redis_url: str, run_dir: Path, resume: bool = False, player: str = MAIN,
                 rank: int = 0, dist_url: str | None = None):
        """`rank` and `dist_url` (tcp://host:port): this process's place among `learner.num_learners`
        learners of the main agent (distributed/data_parallel.py); unused with one learner. Joining the
        process group blocks until every rank has joined. Raises ConfigError, CheckpointError,
        DataParallelError."""
        self.cfg = cfg
        self.player = player
        self.spec = env_spec(cfg.env.name, cfg.env.kwargs, cfg.env.seats)
        self.device = pick_device(cfg.learner.device)
        # Several learners (data parallel): rank 0 is the learner of one; the others only train.
        if cfg.learner.num_learners > 1 and dist_url is None:
            raise ConfigError(f"learner.num_learners={cfg.learner.num_learners}: each learner needs its --rank and "
                              "the rendezvous --dist-url tcp://<rank 0 host>:<port> (run.py train passes both)")
        self.device = cuda_device_for(rank, self.device)
        self.group = join(rank, cfg.learner.num_learners, dist_url, self.device) if dist_url else Group.single()
        torch.manual_seed(cfg.run.seed)
        self.model = make_model(self.spec, cfg.agent).to(self.device)
        self.head = policy_head(self.spec)
        self.optimizer = make_optimizer(self.model, cfg.learner)
        self.step = self.frames = 0
        self.checkpoints = Checkpoints(cfg, run_dir, player, self.spec.name, self.group.is_main, self.label)
        if resume and not self.group.is_main:
            pass  # rank 0's state reaches this rank in sync_start
        elif resume and self.checkpoints.path.exists():
            self.step, self.frames = self.checkpoints.restore(self.model, self.optimizer)
        elif resume:
            log.warning("--resume: no checkpoint at %s; starting from scratch", self.checkpoints.path)
        self.redis = connect(redis_url, block_ms=cfg.learner.read_block_ms, retry_s=cfg.run.redis_retry_s)
        prefix = namespace(cfg.run.name, player)  # of this learner's own keys
        self.params = ParamStore(self.redis, prefix, delay=cfg.actor.weight_delay)
        # The run's lease: one learner (rank 0 of several) trains it; taken in `start`.
        self.lease = LearnerLease(self.redis, prefix, f"{socket.gethostname()} pid {os.getpid()}",
                                  ttl_s=cfg.run.lease_ttl_s)
        if self.checkpoints.league_resets is None:  # else one asked for while it was down is applied at once
            self.checkpoints.league_resets = self.league_resets()
        self.stopping = False
        self.stop_signal: int | None = None  # the signal that asked it to stop (SIGTERM, SIGINT), if one did
        self.mirror = Mirror(self.spec, cfg.learner.mirror_augment, self.device, seed=cfg.run.seed * 1009 + rank)
        consumer = f"learner-{socket.gethostname()}" + (f"-rank{rank}" if rank else "")
        self.ingest = self.make_ingest(redis_url, prefix, consumer, rank)
        self.metrics = LearnerMetrics(cfg, run_dir, player, self.spec, self.group.is_main, self.redis, self.params,
                                      self.ingest.trajectories, self.ingest.unrolls_per_entry, self.ingest.replay)

    @property
    def label(self) -> str:
        """This learner in log lines: its role, its player unless it is the main agent, its rank among several."""
        label = self.role if self.player == MAIN else f"{self.role} {self.player}"
        return label + (f" rank {self.group.rank}" if self.group.distributed else "")

    def checkpoint(self) -> None:
        """Save model, optimizer, step, frames and the run's carried state (`Checkpoints.save`: rank 0
        alone, while the run directory is ours)."""
        self.checkpoints.save(self.model, self.optimizer, self.step, self.frames)

    def stop(self, signum: int | None = None, _frame: object = None) -> None:
        """Stop before the next update; a signal handler (`signum`: the signal, kept for the exit code)."""
        self.stopping = True
        self.stop_signal = self.stop_signal or signum

    def league_resets(self) -> int:
        """How many times the league manager has asked to reset this learner's weights (league/store.py)."""
        return LeagueStore(self.redis, self.cfg.run.name).reset_count(self.player)

    def follow_league(self) -> None:
        """Re-initialise weights and optimizer when the league manager resets this exploiter (AlphaStar
        resets exploiters so that they keep finding new weaknesses rather than polishing one)."""
        count = self.league_resets()
        if count == self.checkpoints.league_resets:
            return
        self.checkpoints.league_resets = count
        torch.manual_seed(self.cfg.run.seed + 7919 * count)
        self.model = make_model(self.spec, self.cfg.agent).to(self.device)
        self.optimizer = make_optimizer(self.model, self.cfg.learner)
        if self.ingest.replay is not None:  # the new weights learn from their own games, not the old ones'
            self.ingest.replay.clear()
        self.params.publish(self.model.state_dict(), self.step, self.frames)
        log.info("%s: weights reset by the league (reset %d) at update %d", self.label, count, self.step)

    # -- reading -----------------------------------------------------------------------------------
    def make_ingest(self, redis_url: str, namespace: str, consumer: str, rank: int) -> Ingest:
        """This learner's reads (`namespace`: the prefix of its keys; `consumer`: its name in the stream's
        group; `rank`: its place among several learners, which seeds its replay): unrolls from every trajectory
        shard (transport.shards), with its replay when learner.replay_fraction > 0 and its ingest workers
        when learner.ingest_workers > 0."""
        cfg = self.cfg
        unroll_spec = UnrollSpec(self.spec, cfg.actor.unroll_length, core_size(cfg.agent))
        replayed = replayed_per_batch(cfg.learner)
        fresh = cfg.learner.batch_size - replayed  # F: unrolls per update from the stream
        settings = None if not cfg.learner.ingest_workers else worker_settings(
            redis_url=redis_url, namespace=namespace, env=cfg.env.name, env_kwargs=dict(cfg.env.kwargs),
            env_seats=cfg.env.seats and [list(seat) for seat in cfg.env.seats],
            unroll_length=cfg.actor.unroll_length, core_size=core_size(cfg.agent), shards=cfg.transport.shards,
            shard_urls=list(cfg.transport.shard_urls), block_ms=cfg.learner.read_block_ms,
            retry_s=cfg.run.redis_retry_s, unrolls_per_entry=cfg.actor.send_batch, fresh=fresh,
            done_key=None if self.player == MAIN else keys.done(cfg.run.name))
        return Ingest(
            cfg, ShardedTrajectories(self.redis, redis_url, namespace, cfg.transport.shards,
                                     cfg.transport.shard_urls, cfg.learner.read_block_ms),
            consumer, fresh=fresh, unrolls_per_entry=cfg.actor.send_batch, unrolls_left=self.unrolls_left,
            stopping=lambda: self.stopping, run_over=self.run_is_over, unroll_spec=unroll_spec,
            replay=make_replay(cfg, unroll_spec, replayed, rank, self.player) if replayed else None,
            pin=self.device.type == "cuda", worker_settings=settings)

    def unrolls_left(self) -> float:
        """Unrolls the run may still read before run.total_agent_steps (every rank reads as many: frames count
        every rank's unrolls)."""
        return (self.cfg.run.total_agent_steps - self.frames) / (self.cfg.actor.unroll_length * self.group.size)

    def run_is_over(self) -> bool:
        """An exploiter's reads end with the main agent's run (its actors are gone then)."""
        return self.player != MAIN and bool(self.redis.exists(keys.done(self.cfg.run.name)))

    def acknowledge(self, ids: list[bytes], headers: list[dict]) -> None:
        """Ack a batch the update has trained on, counting its unrolls as trained (`Ingest.acknowledge`)."""
        trained = self.ingest.acknowledge(ids, headers)
        if trained is not None:  # (ingest workers ack for the learner: `checkpoint_trained` reads their count)
            self.checkpoints.unrolls_trained = trained

    # -- main loop ---------------------------------------------------------------------------------
    def run(self) -> None:
        """Train until `run.total_agent_steps` (or `run.max_minutes`, or a stop signal), then checkpoint: take
        the next batch, train on it, acknowledge it, record it; checkpoint when one is due.

        Several learners (`learner.num_learners`) run this loop in step: they agree before every update
        whether to go on (`next_batch`), so they stop at the same update, and all-reduce the gradients in it.
        Raises DataParallelError when a peer rank is gone."""
        if not self.start():
            return
        try:
            while (got := self.next_batch()) is not None:
                (ids, headers, prepared), lr = got
                if self.checkpoints.due(time.monotonic()):
                    self.checkpoint_trained()  # here: once the ranks agreed to go on, each has acked its last batch
                frames = self.frames
                stats = self.train(prepared, lr)
                # Replay first: a worker's batch lives in its shared-memory slot until the ack gives it back.
                replay_lags = self.ingest.remember(prepared, headers, stats, self.step)
                self.acknowledge(ids, headers)
                self.record(self.frames - frames, headers, stats, replay_lags)
                if self.player != MAIN and self.step % 10 == 0:
                    self.follow_league()
        finally:
            self.ingest.close()  # what it read ahead stays pending
        # The last, partial window: a run shorter than run.log_every_s still gets a record.
        if self.metrics.window.stats and self.group.is_main:
            self.log_metrics(time.monotonic())
        self.finish()

    def start(self) -> bool:
        """Take the run's lease (rank 0), give every rank rank 0's state, ready the stream (its group, the
        entries a stopped learner left pending, the unrolls acked after the checkpoint), publish the first
        weights, start the trackers, the clocks and the reads ahead. False when told to stop while waiting
        for the lease (nothing is trained then). Raises LeaseHeld when another live learner keeps it."""
        cfg, main = self.cfg, self.group.is_main
        acquired = self.lease.acquire(should_stop=lambda: self.stopping) if main else True
        (refused,), _ = self.group.agree((not acquired,), 0.0, self.device)
        if refused:
            self.metrics.close()
            return False
        self.sync_start()
        # A `done` left by an earlier end of this run (now resumed with more frames) would send every
        # actor home at once and starve this learner. The launcher clears it too; standalone learners need this.
        if self.player == MAIN and main:
            self.redis.delete(keys.done(cfg.run.name))
        self.ingest.trajectories.ensure_group()
        if main:
            self.checkpoints.count_rolled_back(self.ingest.trajectories.accounting()["trained"])
        self.ingest.claim_stale()
        if main:
            self.metrics.results.skip_to_end()
            self.params.publish(self.model.state_dict(), self.step, self.frames)
            self.metrics.start_tracking(self.step)
        log.info("%s on %s, %s, %d params; training to %s agent steps%s", self.label, self.device, self.spec.name,
                 sum(p.numel() for p in self.model.parameters()), f"{cfg.run.total_agent_steps:,}",
                 f" or {cfg.run.max_minutes:g} minutes, whichever comes first" if cfg.run.max_minutes else "")
        started = time.monotonic()
        self.checkpoints.start_clock(started)
        self.metrics.start(started)
        self.ingest.start()
        return True

    def next_batch(self) -> tuple[tuple[list, list[dict], object], float] | None:
        """The next batch (ids, headers, prepared) and the learning rate to train on it with; None to stop.
        Every rank stops when one has no batch (`reached_end`, or an exploiter's run is over) or was told
        to stop, and trains at rank 0's learning rate (`Group.agree`; nothing to agree with one learner).
        The wait for the batch is counted in the metrics window."""
        waited = time.monotonic()
        got = None if self.reached_end() else self.ingest.get()
        self.metrics.window.waited_s += time.monotonic() - waited
        # Rank 0's learning rate for all: `linear` counts rank 0's clock (run.max_minutes).
        lr = scheduled_learning_rate(self.cfg, self.frames, self.checkpoints.elapsed())
        (stop, interrupted), lr = self.group.agree((got is None, self.stopping), lr, self.device)
        if interrupted and not self.stopping:  # a signal to one rank stops them all
            self.stopping, self.stop_signal = True, signal.SIGTERM  # as if it came here: 143
        return None if stop else (got, lr)

    def reached_end(self) -> bool:
        """This learner's own reasons to stop before the next update: a stop signal, run.total_agent_steps
        (the same on every rank: frames count every rank's unrolls), run.max_minutes."""
        if self.stopping or self.frames >= self.cfg.run.total_agent_steps:
            return True
        if self.cfg.run.max_minutes and self.checkpoints.elapsed() > 60 * self.cfg.run.max_minutes:
            log.info("reached run.max_minutes=%s", self.cfg.run.max_minutes)
            return True
        return False

    # -- several learners (distributed/data_parallel.py) -------------------------------------------
    def sync_start(self) -> None:
        """Give every rank rank 0's weights, optimizer state, update step, frames and training seconds
        (fresh or resumed: identical initial weights too). Nothing with one learner."""
        meta = broadcast_state(self.model, self.optimizer, {"step": self.step, "frames": self.frames,
                                                            "elapsed_s": self.checkpoints.elapsed_before},
                               self.group, self.device)
        self.step, self.frames = int(meta["step"]), int(meta["frames"])
        self.checkpoints.elapsed_before = float(meta["elapsed_s"])

    def checkpoint_trained(self) -> None:
        """`checkpoint` between updates. With several learners every rank has acked what it trained on
        once they agreed to go on, so rank 0 records the run's trained count from Redis, not its own acks'
        (so does a learner whose ingest workers ack for it: up to learner.prefetch_batches acks may be
        on their way, which a crash's `rolled_back` would count too)."""
        if (self.group.distributed or self.ingest.workers is not None) and self.group.is_main:
            self.checkpoints.unrolls_trained = self.ingest.trajectories.accounting()["trained"]
        self.checkpoint()

    def train(self, prepared: object, lr: float) -> dict[str, float]:
        """`train_on` the batch at learning rate `lr`; its seconds are counted in the metrics window."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        started = time.monotonic()
        stats = self.train_on(prepared)
        self.metrics.window.update_s += time.monotonic() - started
        return stats

    def record(self, frames: int, headers: list[dict], stats: dict[str, float], replay_lags: list[int]) -> None:
        """Add the update just made to the metrics window (the `frames` it trained on, the policy lag of
        the unrolls of the entries with `headers`, its `stats`, the lags of the replayed unrolls), and
        log the window when it is due (rank 0)."""
        lags = [self.step - 1 - version for version in self.ingest.unroll_versions(headers)]
        self.metrics.window.add(frames, lags, stats, replay_lags)
        now = time.monotonic()
        if now - self.metrics.window.start >= self.cfg.run.log_every_s and self.group.is_main:
            self.log_metrics(now)

    def train_on(self, prepared: Prepared) -> dict[str, float]:
        """One update on a batch of B unrolls (from `prepare`); publishes the weights on schedule.
        With K learners the gradient is that of all K batches. Frames count the agent steps consumed,
        K x F x T with F fresh unrolls per batch: replayed ones were counted when they were fresh."""
        batch = prepared.batch.to(self.device)
        unrolls = batch.action.shape[1] - len(prepared.replayed_versions)
        batch = self.mirror(batch)
        stats = learn_step(self.model, self.optimizer, batch, self.cfg.learner, self.head,
                           partial(average_gradients, group=self.group))  # (nothing with one learner)
        if stats["skipped_update"]:
            log.warning("update %d skipped: non-finite loss or gradient (loss %s); the batch held extreme values",
                        self.step + 1, stats["loss"])
        self.step += 1
        self.frames += self.cfg.actor.unroll_length * unrolls * self.group.size
        if self.cfg.learner.redo_every and self.step % self.cfg.learner.redo_every == 0:
            self.recycle(batch)
        if self.step % self.cfg.learner.publish_every == 0 and self.group.is_main:
            self.params.publish(self.model.state_dict(), self.step, self.frames)
        return stats

    def recycle(self, batch: Batch) -> None:
        """ReDo (agents.redo) over the observations of the batch just trained on: every learner recycles
        the same units (scores averaged over them, the same seed)."""
        recycled, units = recycle_dormant_units(self.model, self.optimizer, flatten_steps(batch.obs),
                                                self.cfg.learner.redo_threshold,
                                                seed=self.cfg.run.seed * 7919 + self.step,
                                                average=partial(average_tensor, group=self.group))
        if self.group.is_main:
            log.info("%s update %d: recycled %d of %d torso units (ReDo)", self.label, self.step, recycled, units)

    def finish(self) -> None:
        """Checkpoint and publish the final weights; tell actors the run is over unless interrupted.
        (Ranks other than 0 of several learners only log.)"""
        self.checkpoints.finished = not self.stopping
        if not self.group.is_main:
            log.info("%s done: %d updates, %d frames", self.label, self.step, self.frames)
            self.metrics.close()
            return
        self.checkpoint_trained()  # first: it needs no Redis
        self.params.publish(self.model.state_dict(), self.step, self.frames)
        if not self.stopping and self.player == MAIN:  # exploiters end with the main agent's run
            self.redis.set(keys.done(self.cfg.run.name), 1)
        self.lease.release()
        log.info("%s done: %d updates, %d frames; checkpoint %s", self.label, self.step, self.frames,
                 self.checkpoints.path)
        self.metrics.close(report=self.player == MAIN and not self.stopping)  # interrupted: no figures, stop now

    def log_metrics(self, now: float) -> None:
        """Write the metrics window ending `now` (`LearnerMetrics.log`) with this learner's progress and the
        stream's delivery counts, those of earlier Redis servers of the run added (`Checkpoints.carry`)."""
        counts = self.checkpoints.carry(self.ingest.trajectories.accounting())
        self.metrics.log(now, step=self.step, frames=self.frames, elapsed_s=self.checkpoints.elapsed(),
                         learning_rate=self.optimizer.param_groups[0]["lr"], counts=counts,
                         rolled_back=self.checkpoints.rolled_back)


def run_learner(cfg: Config, redis_url: str, run_dir: Path, resume: bool = False, player: str = MAIN,
                learner_class: type = Learner, report: Callable[[Path, Tracker], None] | None = None,
                rank: int = 0, dist_url: str | None = None) -> int:
    """Entry point of `run.py learner` (`learner_class`: Learner, or A3C's parameter server): stop
    cleanly (final checkpoint) on SIGTERM/SIGINT. `report(run_dir, tracker)`, if given, logs the
    report's figures to the trackers at the end of the run. `rank`, `dist_url`: see `Learner`.
    Returns the exit code: 0 once the run is over, 128 + N when signal N stopped it before
    (`stopped_exit_code`; a rank stopped by another rank's signal: 143, as if by SIGTERM).
    Raises RedisUnavailable, DataParallelError (a peer rank died; rank 0 writes its checkpoint first),
    IngestWorkerError (an ingest worker failed; the checkpoint is written first)."""
    torch.set_num_threads(cfg.learner.num_threads)
    keep_freed_memory()
    learner = learner_class(cfg, redis_url, run_dir, resume, player, rank=rank, dist_url=dist_url)
    learner.metrics.report = report
    written = f"checkpoint at update {{}} written to {learner.checkpoints.path}"

    def lost_redis(e: Exception) -> str:
        learner.checkpoint()  # keep what was learned: the checkpoint is a local file
        return f"the learner lost Redis ({type(e).__name__}: {e}); {written.format(learner.step)}; `--resume` continues"

    def failed(e: Exception) -> str:
        # An ingest worker or a peer rank is gone. The update that failed has not stepped: the weights are
        # those of the last update (every rank) made.
        try:
            learner.checkpoint_trained()
            if learner.group.is_main:
                learner.lease.release()  # so that `--resume` needs not wait for it to lapse
        except redis.RedisError:
            learner.checkpoint()
        if isinstance(e, IngestWorkerError):
            return f"{e}; {written.format(learner.step)}; `--resume` continues (what the workers held is read again)"
        return f"{e}{'; ' + written.format(learner.step) if rank == 0 else ''}; `run.py train --resume RUN_DIR` continues"

    try:
        return run_role(learner, lost_redis,
                        lambda: learner.checkpoints.finished or run_is_over(learner.redis, cfg.run.name),
                        (IngestWorkerError, DataParallelError), failed)
    finally:
        learner.group.close()
