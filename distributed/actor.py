"""Actor process: steps many envs with batched forward passes and sends fixed-length unrolls.

Every agent that plays the learner's seat (a seat of a board game, each unit of a battle team) is a
learning stream whose unrolls go to its learner; agents played by a league opponent (a snapshot,
another learner, a bot) only act.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
import uuid
from collections import OrderedDict

import numpy as np
import redis
import torch
from safetensors import SafetensorError

from agents.heads import make_model, policy_head
from config import Config, ConfigError
from distributed.codec import UnrollSpec, decode_weights, encode_unroll
from distributed.params import ParamStore
from distributed.transport import RedisUnavailable, ResultsStream, TrajectoryStream, connect, run_done_key
from envs.registry import env_spec, make_env
from evaluation.bots import BOT_SPECS as BOT_NAMES, make_bot
from league.matchmaking import SELF
from league.players import MAIN, PLAYER_ID, namespace
from league.store import LeagueStore

log = logging.getLogger("actor")

RESULTS_EVERY_S = 1.0  # episode results wait at most this long; the league manager reads every 2 s
RUN_OVER_CHECK_S = 0.5  # the run's done key is looked up at most this often


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
        self.stepped = [name for name in self.arrays if name.startswith("obs") or name == "action_mask"]  # T+1 long
        self.behaviour = "behaviour_logits" if "behaviour_logits" in self.arrays else "behaviour_log_probs"
        self.n = 0  # observed steps in the current unroll

    def observe(self, obs: np.ndarray | dict[str, np.ndarray], action_mask: np.ndarray) -> dict[str, np.ndarray] | None:
        """obs: one array, or a dict of named arrays (stored as `obs.<name>`, see UnrollSpec)."""
        a = self.arrays
        for name, value in (obs.items() if isinstance(obs, dict) else [("", obs)]):
            a[f"obs.{name}" if name else "obs"][self.n] = value
        a["action_mask"][self.n] = action_mask
        self.n += 1
        if self.n <= self.T:
            return None
        unroll = {name: array.copy() for name, array in a.items()}
        for name in self.stepped:
            a[name][0] = a[name][self.T]
        self.n = 1
        return unroll

    def record_action(self, action: int | np.ndarray, behaviour: np.ndarray) -> None:
        """The action taken at the open step and mu's record of it (logits, or per-head log-probs)."""
        t = self.n - 1
        self.arrays["action"][t] = action
        self.arrays[self.behaviour][t] = behaviour
        self.arrays["reward"][t] = 0.0
        self.arrays["done"][t] = 0

    def settle(self, reward: float, done: bool) -> None:
        t = self.n - 1
        self.arrays["reward"][t] += reward
        self.arrays["done"][t] = done


class Opponents:
    """The policies that play a learner's opponents, by id, loaded on first use and cached.

    Ids: a learner id (`main`, ...) = that learner's latest published weights, refreshed by `refresh`;
    a snapshot id = frozen weights from the league store (beyond `league.opponent_cache` of them, the
    least recently used one that no episode is playing is dropped); a bot spec (`random`,
    `tactical`, `minimax:D`) = that bot.
    `get` returns None when an id cannot be played (unknown, corrupt, or not fitting this network)
    and logs why once; the actor then plays that episode as self-play.
    """

    def __init__(self, client: redis.Redis, cfg: Config, spec, seed: int):
        self.r = client
        self.cfg = cfg
        self.spec = spec
        self.seed = seed
        self.store = LeagueStore(client, cfg.run.name)
        self.snapshots: OrderedDict[str, torch.nn.Module] = OrderedDict()
        self.learners: dict[str, tuple[ParamStore, int, torch.nn.Module]] = {}
        self.bots: dict[str, object] = {}
        self.failed: set[str] = set()

    def _model(self, state_dict: dict[str, torch.Tensor]) -> torch.nn.Module:
        model = make_model(self.spec, self.cfg.agent)
        model.load_state_dict(state_dict)
        return model.eval()

    def _fail(self, opponent_id: str, why: str) -> None:
        if opponent_id not in self.failed:
            log.warning("opponent %r cannot be played (%s); playing those episodes against the latest weights",
                        opponent_id, why)
            self.failed.add(opponent_id)

    def get(self, opponent_id: str, in_use: set[str] = frozenset()):
        """A network or a bot for `opponent_id`, or None (see the class doc). Snapshots in
        `in_use` (the opponents of running episodes) are never dropped from the cache."""
        if opponent_id in self.snapshots:
            self.snapshots.move_to_end(opponent_id)
            return self.snapshots[opponent_id]
        if opponent_id in self.learners:
            return self.learners[opponent_id][2]
        if opponent_id in self.bots:
            return self.bots[opponent_id]
        if opponent_id in self.failed:
            return None
        try:
            if opponent_id in BOT_NAMES or opponent_id.startswith("minimax:"):
                self.bots[opponent_id] = make_bot(opponent_id, self.spec.name, seed=self.seed)
                return self.bots[opponent_id]
            if PLAYER_ID.fullmatch(opponent_id):
                store = ParamStore(self.r, namespace(self.cfg.run.name, opponent_id))
                fetched = store.fetch()
                if fetched is None:
                    return None  # that learner has not published yet: not a failure
                self.learners[opponent_id] = (store, fetched[0], self._model(fetched[1]))
                return self.learners[opponent_id][2]
            data = self.store.snapshot(opponent_id)
            if data is None:
                self._fail(opponent_id, f"no snapshot under {self.store.snapshot_key(opponent_id)}")
                return None
            self.snapshots[opponent_id] = self._model(decode_weights(data))
        except (ValueError, RuntimeError, SafetensorError) as e:
            self._fail(opponent_id, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            return None
        idle = [s for s in self.snapshots if s not in in_use and s != opponent_id]
        for dropped in idle[:max(0, len(self.snapshots) - self.cfg.league.opponent_cache)]:
            del self.snapshots[dropped]
        return self.snapshots[opponent_id]

    def refresh(self) -> None:
        """Reload the latest weights of the learners played against, where their version changed."""
        for opponent_id, (store, version, model) in list(self.learners.items()):
            if store.version() != version:
                fetched = store.fetch()
                if fetched is not None:
                    try:
                        model.load_state_dict(fetched[1])
                    except RuntimeError as e:
                        self._fail(opponent_id, f"weights do not fit: {str(e).splitlines()[0]}")
                        del self.learners[opponent_id]
                        continue
                    self.learners[opponent_id] = (store, fetched[0], model)


class Actor:
    """Runs `cfg.actor.num_envs` envs of `cfg.env.name` for learner `player`; see `run` for the loop.

    Without a league every seat plays the latest weights and learns (self-play). With one, each env
    draws an opponent from the distribution the league manager publishes at every episode start:
    `self` (both seats learn) or a league member that plays one seat (chosen at random) while the
    learner plays and learns from the other.
    """

    def __init__(self, cfg: Config, redis_url: str, actor_id: int, player: str = MAIN):
        self.cfg = cfg
        self.actor_id = actor_id
        self.player = player
        self.redis = connect(redis_url, retry_s=cfg.run.redis_retry_s)  # first: a wrong URL fails before envs are built
        self.spec = env_spec(cfg.env.name, cfg.env.kwargs)
        self.unroll_spec = UnrollSpec(self.spec, cfg.actor.unroll_length)
        seed = cfg.run.seed + 1000 * (actor_id + 1)
        self.rng = torch.Generator().manual_seed(seed)
        self.np_rng = np.random.default_rng(seed)
        self.envs = [make_env(cfg.env.name, seed * 100_003 + 7919 * i, cfg.env.kwargs)
                     for i in range(cfg.actor.num_envs)]
        self.buffers = [[UnrollBuffer(self.unroll_spec) for _ in self.spec.agents] for _ in self.envs]
        self.model = make_model(self.spec, cfg.agent)
        self.model.eval()
        self.head = policy_head(self.spec)
        # Env i explores with epsilon_i spread evenly over [0, actor.epsilon]: some envs play the
        # policy as it is, others see the positions that off-policy moves lead to.
        self.epsilons = torch.linspace(0, cfg.actor.epsilon, cfg.actor.num_envs)
        own = namespace(cfg.run.name, player)
        self.trajectories = TrajectoryStream(self.redis, own)
        self.results = ResultsStream(self.redis, cfg.run.name)
        self.params = ParamStore(self.redis, own, delay=cfg.actor.weight_delay)
        self.league = LeagueStore(self.redis, cfg.run.name)
        self.opponents = Opponents(self.redis, cfg, self.spec, seed)
        self.distribution: dict[str, float] | None = None
        self.opponent = [SELF] * len(self.envs)  # per env: who plays the other seat this episode
        self.learner_seat = [-1] * len(self.envs)  # per env: the learning seat, -1 = every seat (self-play)
        self.done_key = run_done_key(cfg.run.name)
        self.version = -1
        self.token = uuid.uuid4().hex[:8]  # unroll ids stay unique across restarts of this actor id
        self.sent = 0
        self.backlog: int | None = None  # the trajectory stream's backlog after our last add
        self.pending_results: list[dict] = []
        self.results_sent_at = time.monotonic()
        self.over, self.over_checked_at = False, -math.inf
        self.stopping = False

    def stop(self, *_: object) -> None:
        self.stopping = True

    def run_over(self) -> bool:
        """Told to stop, or the run's done key is set (looked up at most every RUN_OVER_CHECK_S)."""
        now = time.monotonic()
        if not self.over and now - self.over_checked_at >= RUN_OVER_CHECK_S:
            self.over, self.over_checked_at = bool(self.redis.exists(self.done_key)), now
        return self.stopping or self.over

    def report(self, episodes: list[dict], flush: bool = False) -> None:
        """Queue episode results; send them at most every RESULTS_EVERY_S (one round trip for many)."""
        self.pending_results += episodes
        if self.pending_results and (flush or time.monotonic() - self.results_sent_at >= RESULTS_EVERY_S):
            self.results.add_many(self.pending_results)
            self.pending_results, self.results_sent_at = [], time.monotonic()

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

    def refresh_opponents(self) -> None:
        """Re-read the league's opponent distribution for this player and the opponents' latest weights."""
        if not self.cfg.league.enabled:
            return
        try:
            self.distribution = self.league.opponents(self.player)
        except ValueError as e:
            log.warning("actor %d: %s; keeping the previous distribution", self.actor_id, e)
        self.opponents.refresh()

    def start_episode(self, i: int) -> None:
        """Draw env i's opponent for the episode that starts now (self-play when there is no league yet)."""
        opponent, seat = SELF, -1
        if self.distribution:
            ids = list(self.distribution)
            drawn = ids[self.np_rng.choice(len(ids), p=np.array(list(self.distribution.values())))]
            if drawn not in (SELF, self.player) and self.opponents.get(drawn, set(self.opponent)) is not None:
                opponent, seat = drawn, int(self.np_rng.integers(len(self.spec.seats)))
        self.opponent[i], self.learner_seat[i] = opponent, seat

    def learns(self, i: int, agent: int) -> bool:
        """Is agent `agent` of env i a learning stream (it plays the learner's seat this episode)?"""
        return self.learner_seat[i] in (-1, self.spec.agent_seats[agent])

    def run(self) -> None:
        """The actor loop: observe all envs, one forward pass per policy to move, act, send finished unrolls."""
        self.sync_params(wait=True)
        self.refresh_opponents()
        log.info("actor %d (pid %d): %d x %s, policy version %d, playing for %s", self.actor_id, os.getpid(),
                 len(self.envs), self.spec.name, self.version, self.player)
        steps = [env.advance() for env in self.envs]
        for i in range(len(self.envs)):
            self.start_episode(i)
        unrolls: list[dict[str, np.ndarray]] = []  # finished, not sent yet
        while not self.stopping:
            episodes = []
            for i, step in enumerate(steps):
                for s in step.settlements:  # they all belong to the episode the opponent was drawn for
                    if self.learns(i, s.agent):
                        self.buffers[i][s.agent].settle(s.reward, s.done)
                if step.episodes:
                    episodes += [self.result(i, e) for e in step.episodes]
                    self.start_episode(i)
                for agent, obs, mask in zip(step.agents, step.observations, step.action_masks):
                    if self.learns(i, agent):
                        unroll = self.buffers[i][agent].observe(obs, mask)
                        if unroll is not None:
                            unrolls.append(unroll)
            self.report(episodes)
            if len(unrolls) >= self.cfg.actor.send_batch:
                if self.send(unrolls):
                    self.report([], flush=True)
                    return
                unrolls = []
            actions = self.choose_actions(steps)
            for i, env in enumerate(self.envs):
                env.act(actions[i])
                steps[i] = env.advance()

    def choose_actions(self, steps: list) -> list[list[int]]:
        """Per env, one action per acting agent: the learner's (recorded in its unroll buffer) or its
        opponent's. Each policy moves all its agents of all envs in one forward pass."""
        actions = [[0] * len(step.agents) for step in steps]
        learning: list[tuple[int, int]] = []  # (env, index into the env's acting agents)
        by_opponent: dict[str, list[tuple[int, int]]] = {}
        for i, step in enumerate(steps):
            for k, agent in enumerate(step.agents):
                if self.learns(i, agent):
                    learning.append((i, k))
                else:
                    by_opponent.setdefault(self.opponent[i], []).append((i, k))
        if learning:
            obs, masks = self.stack(steps, learning)
            logits = self.forward(self.model, obs, masks)
            drawn, behaviour = self.head.sample(logits, masks, self.epsilons[[i for i, _ in learning]], self.rng)
            chosen, behaviour_np = drawn.numpy(), behaviour.numpy()
            for n, (i, k) in enumerate(learning):
                self.buffers[i][steps[i].agents[k]].record_action(chosen[n], behaviour_np[n])
                actions[i][k] = chosen[n]
        in_use = set(self.opponent)
        for opponent_id, pairs in by_opponent.items():
            # None: the opponent vanished mid-episode (e.g. Redis lost its weights); the latest
            # weights finish the episode for it, without learning.
            policy = self.opponents.get(opponent_id, in_use)
            if policy is None:
                policy = self.model
            if isinstance(policy, torch.nn.Module):
                obs, masks = self.stack(steps, pairs)
                chosen = self.head.play(self.forward(policy, obs, masks), self.rng,
                                        self.cfg.league.opponent_temperature).numpy()
            else:  # a bot, for all its envs at once
                chosen = policy.act_batch(np.stack([steps[i].observations[k] for i, k in pairs]),
                                          np.stack([steps[i].action_masks[k] for i, k in pairs])).tolist()
            for (i, k), action in zip(pairs, chosen):
                actions[i][k] = action
        return actions

    @staticmethod
    def stack(steps: list, pairs: list[tuple[int, int]]) -> tuple[torch.Tensor | dict[str, torch.Tensor], torch.Tensor]:
        """Observations [N, *obs_shape] (a dict of such per name for envs with several observation
        arrays) and action masks [N, A] of acting agents `pairs` (env, index)."""
        observations = [steps[i].observations[k] for i, k in pairs]
        if isinstance(observations[0], dict):
            obs = {name: torch.from_numpy(np.stack([o[name] for o in observations])) for name in observations[0]}
        else:
            obs = torch.from_numpy(np.stack(observations))
        return obs, torch.from_numpy(np.stack([steps[i].action_masks[k] for i, k in pairs]))

    @staticmethod
    def forward(model: torch.nn.Module, obs, masks: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            logits, _ = model(obs, masks)
        return logits

    def send(self, unrolls: list[dict[str, np.ndarray]]) -> bool:
        """XADD finished unrolls after waiting for room; sync params on schedule. True = run is over."""
        self.trajectories.wait_for_room(self.cfg.actor.high_water_mark, self.run_over, backlog=self.backlog)
        if self.run_over():
            return True
        payloads = []
        for unroll in unrolls:
            payloads.append(encode_unroll(unroll, unroll_id=f"{self.actor_id}-{self.token}-{self.sent}",
                                          policy_version=self.version, actor_id=self.actor_id, env=self.spec.name,
                                          compression=self.cfg.transport.compression,
                                          level=self.cfg.transport.compression_level))
            self.sent += 1
        self.backlog = self.trajectories.add(payloads, producer=f"{self.actor_id}-{self.token}", produced=self.sent)
        if self.sent // self.cfg.actor.param_sync_every != (self.sent - len(unrolls)) // self.cfg.actor.param_sync_every:
            self.sync_params()
            self.refresh_opponents()
        return False

    def result(self, i: int, episode) -> dict:
        """The report of a finished episode of env i, for the learner's metrics and the league's payoff."""
        return {"actor_id": self.actor_id, "player": self.player, "policy_version": self.version,
                "opponent_id": self.opponent[i], "learner_seat": self.learner_seat[i],
                "winner": -1 if episode.winner is None else episode.winner, "length": episode.length,
                "returns": list(episode.returns)}


def run_actor(cfg: Config, redis_url: str, actor_id: int, player: str = MAIN, actor_class: type = Actor) -> None:
    """Entry point of `run.py actor` (`actor_class`: Actor, or a subclass such as A3C's worker): one
    thread for torch, stop cleanly on SIGTERM/SIGINT."""
    torch.set_num_threads(1)
    actor = actor_class(cfg, redis_url, actor_id, player)
    signal.signal(signal.SIGTERM, actor.stop)
    signal.signal(signal.SIGINT, actor.stop)
    try:
        actor.run()
    except redis.RedisError as e:
        raise RedisUnavailable(f"actor {actor_id} lost Redis: {type(e).__name__}: {e}") from None
    log.info("actor %d (pid %d): sent %d unrolls, stopping", actor_id, os.getpid(), actor.sent)
