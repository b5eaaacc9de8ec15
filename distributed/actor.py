"""Actor process: steps many envs with one batched forward pass and sends fixed-length unrolls.

Self-play: every seat of every env is played by the actor's copy of the current policy, and every
seat is a learning stream whose unrolls go to the learner.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid

import numpy as np
import redis
import torch
from safetensors import SafetensorError

from agents.network import ActorCritic, explore, sample_actions
from config import Config, ConfigError
from distributed.codec import UnrollSpec, encode_unroll
from distributed.params import ParamStore
from distributed.transport import RedisUnavailable, ResultsStream, TrajectoryStream, connect, run_done_key
from envs.registry import env_spec, make_env

log = logging.getLogger("actor")


class UnrollBuffer:
    """Builds the unrolls of one learning stream (one seat of one env), episodes concatenated.

    A step is opened by `observe` (the seat must act), gets its action from `record_action`, and is
    closed by `settle` (its reward and done flag, known once the seat observes again or the game ends).
    When step T is observed, steps 0..T-1 are complete and step T's observation is the bootstrap
    observation: `observe` returns the finished unroll and step T becomes step 0 of the next one.
    """

    def __init__(self, spec: UnrollSpec):
        self.T = spec.unroll_length
        self.arrays = {name: np.zeros(shape, dtype) for name, (dtype, shape) in spec.arrays.items()}
        self.n = 0  # observed steps in the current unroll

    def observe(self, obs: np.ndarray, action_mask: np.ndarray) -> dict[str, np.ndarray] | None:
        a = self.arrays
        a["obs"][self.n] = obs
        a["action_mask"][self.n] = action_mask
        self.n += 1
        if self.n <= self.T:
            return None
        unroll = {name: array.copy() for name, array in a.items()}
        a["obs"][0] = a["obs"][self.T]
        a["action_mask"][0] = a["action_mask"][self.T]
        self.n = 1
        return unroll

    def record_action(self, action: int, logits: np.ndarray) -> None:
        t = self.n - 1
        self.arrays["action"][t] = action
        self.arrays["behaviour_logits"][t] = logits
        self.arrays["reward"][t] = 0.0
        self.arrays["done"][t] = 0

    def settle(self, reward: float, done: bool) -> None:
        t = self.n - 1
        self.arrays["reward"][t] += reward
        self.arrays["done"][t] = done


class Actor:
    """Runs `cfg.actor.num_envs` envs of `cfg.env.name`; see `run` for the loop."""

    def __init__(self, cfg: Config, redis_url: str, actor_id: int):
        self.cfg = cfg
        self.actor_id = actor_id
        self.redis = connect(redis_url, retry_s=cfg.run.redis_retry_s)  # first: a wrong URL fails before envs are built
        self.spec = env_spec(cfg.env.name)
        self.unroll_spec = UnrollSpec(self.spec, cfg.actor.unroll_length)
        seed = cfg.run.seed + 1000 * (actor_id + 1)
        self.rng = torch.Generator().manual_seed(seed)
        self.envs = [make_env(cfg.env.name, seed=seed * 100_003 + 7919 * i) for i in range(cfg.actor.num_envs)]
        self.buffers = [[UnrollBuffer(self.unroll_spec) for _ in self.spec.seats] for _ in self.envs]
        self.model = ActorCritic(self.spec.obs_shape, self.spec.num_actions, cfg.agent)
        self.model.eval()
        # Env i explores with epsilon_i spread evenly over [0, actor.epsilon]: some envs play the
        # policy as it is, others see the positions that off-policy moves lead to.
        self.epsilons = torch.linspace(0, cfg.actor.epsilon, cfg.actor.num_envs)
        self.trajectories = TrajectoryStream(self.redis, cfg.run.name)
        self.results = ResultsStream(self.redis, cfg.run.name)
        self.params = ParamStore(self.redis, cfg.run.name)
        self.done_key = run_done_key(cfg.run.name)
        self.version = -1
        self.token = uuid.uuid4().hex[:8]  # unroll ids stay unique across restarts of this actor id
        self.sent = 0
        self.stopping = False

    def stop(self, *_: object) -> None:
        self.stopping = True

    def run_over(self) -> bool:
        return self.stopping or bool(self.redis.exists(self.done_key))

    def sync_params(self, wait: bool = False) -> None:
        """Load the latest published weights if their version changed (waiting for the first ones)."""
        waited, start = False, time.monotonic()
        while True:
            if self.params.version() != self.version:
                try:
                    fetched = self.params.fetch()
                    if fetched is not None:
                        self.model.load_state_dict(fetched[1])
                except (RuntimeError, ValueError, SafetensorError) as e:
                    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
                    detail = lines[1] if len(lines) > 1 else (lines[0] if lines else type(e).__name__)
                    raise ConfigError(f"the weights published under '{self.params.key}' do not fit this actor's "
                                      f"network: does its config (env.name, agent.*) match the learner's? ({detail})"
                                      ) from None
                if fetched is not None:
                    self.version = fetched[0]
                    return
            if not wait or self.run_over():
                return
            if not waited and time.monotonic() - start > 5:
                log.info("actor %d: waiting for the learner to publish weights under '%s'", self.actor_id,
                         self.params.key)
                waited = True
            time.sleep(0.2)

    def run(self) -> None:
        """The actor loop: observe all envs, one forward pass, act, send finished unrolls."""
        self.sync_params(wait=True)
        log.info("actor %d (pid %d): %d x %s, policy version %d", self.actor_id, os.getpid(), len(self.envs),
                 self.spec.name, self.version)
        turns = [env.advance() for env in self.envs]
        while not self.stopping:
            unrolls, episodes = [], []
            for i, turn in enumerate(turns):
                for s in turn.settlements:
                    self.buffers[i][s.seat].settle(s.reward, s.done)
                episodes += turn.episodes
                unroll = self.buffers[i][turn.seat].observe(turn.observation, turn.action_mask)
                if unroll is not None:
                    unrolls.append(unroll)
            if episodes:
                self.report(episodes)
            if unrolls and self.send(unrolls):
                return
            obs = torch.from_numpy(np.stack([t.observation for t in turns]))
            masks = torch.from_numpy(np.stack([t.action_mask for t in turns]))
            with torch.no_grad():
                logits, _ = self.model(obs, masks)
            if self.cfg.actor.epsilon > 0:
                logits = explore(logits, masks, self.epsilons)
            actions = sample_actions(logits, self.rng).numpy()
            logits_np = logits.numpy()
            for i, (env, turn) in enumerate(zip(self.envs, turns)):
                self.buffers[i][turn.seat].record_action(actions[i], logits_np[i])
                env.act(actions[i])
                turns[i] = env.advance()

    def send(self, unrolls: list[dict[str, np.ndarray]]) -> bool:
        """XADD finished unrolls after waiting for room; sync params on schedule. True = run is over."""
        self.trajectories.wait_for_room(self.cfg.actor.high_water_mark, self.run_over)
        if self.run_over():
            return True
        payloads = []
        for unroll in unrolls:
            payloads.append(encode_unroll(unroll, unroll_id=f"{self.actor_id}-{self.token}-{self.sent}",
                                          policy_version=self.version, actor_id=self.actor_id, env=self.spec.name))
            self.sent += 1
        self.trajectories.add(payloads)
        if self.sent // self.cfg.actor.param_sync_every != (self.sent - len(unrolls)) // self.cfg.actor.param_sync_every:
            self.sync_params()
        return False

    def report(self, episodes) -> None:
        self.results.add_many([
            {"actor_id": self.actor_id, "policy_version": self.version, "opponent_id": "self",
             "winner": -1 if e.winner is None else e.winner, "length": e.length, "returns": list(e.returns)}
            for e in episodes])


def run_actor(cfg: Config, redis_url: str, actor_id: int) -> None:
    """Entry point of `run.py actor`: one thread for torch, stop cleanly on SIGTERM/SIGINT."""
    torch.set_num_threads(1)
    actor = Actor(cfg, redis_url, actor_id)
    signal.signal(signal.SIGTERM, actor.stop)
    signal.signal(signal.SIGINT, actor.stop)
    try:
        actor.run()
    except redis.RedisError as e:
        raise RedisUnavailable(f"actor {actor_id} lost Redis: {type(e).__name__}: {e}") from None
    log.info("actor %d (pid %d): sent %d unrolls, stopping", actor_id, os.getpid(), actor.sent)
