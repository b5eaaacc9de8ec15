"""Actor process: steps many envs with batched forward passes and sends fixed-length unrolls.

Every agent that plays the learner's seat (a seat of a board game, each unit of a battle team) is a
learning stream whose unrolls go to its learner; agents played by a league opponent (a snapshot,
another learner, a bot) only act. Each stream's unrolls are built by an `UnrollBuffer`
(unroll_buffer.py).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
import uuid
from dataclasses import dataclass, field

import numpy as np
import redis
import torch
from safetensors import SafetensorError

from impala_league.agents.core import CoreStates
from impala_league.agents.heads import DiscreteHead, FunctionCallHead
from impala_league.agents.model import make_model, policy_head
from impala_league.config import Config, ConfigError, core_size
from impala_league.distributed.launch.allocator import keep_freed_memory
from impala_league.distributed.launch.ownership import run_role
from impala_league.distributed.unroll_buffer import UnrollBuffer
from impala_league.distributed.wire import keys
from impala_league.distributed.wire.codec import UnrollSpec, WeightsCorrupt, encode_unrolls
from impala_league.distributed.wire.params import ParamStore, params_replica
from impala_league.distributed.wire.transport import (LearnerLease, LeaseHeld, ResultsStream, TrajectoryStream,
                                                      actor_shard, connect, connect_shard, run_is_over, shard_urls)
from impala_league.envs.registry import env_spec, make_envs
from impala_league.league.opponents import BotFactory, Match, Opponents
from impala_league.league.players import MAIN, namespace

log = logging.getLogger("actor")

RESULTS_EVERY_S = 1.0  # episode results wait at most this long; the league manager reads every 2 s
RUN_OVER_CHECK_S = 0.5  # the run's done key is looked up at most this often


MAX_ACTOR_ID = 100_000  # far beyond any run: no free id below it means ids are not being released


def claim_actor_id(client: redis.Redis, run: str, actor_id: int | None,
                   holder: str, ttl_s: float | None = None) -> tuple[LearnerLease, int, int]:
    """Register this process as an actor of `run`: (lease, actor id, start number).

    actor_id: the id asked for (`run.py actor --actor-id N`); if another live process holds it, this
      waits up to one lease TTL (a crashed actor's lease lapses by then, so the launcher can restart
      it) and then refuses. None: the lowest id nobody holds, at once (several machines need not
      agree on ids beforehand).
    holder: names this process in the lease (host, pid and a token), shown to the one refused.
    ttl_s: the lease's TTL (run.lease_ttl_s); None: LearnerLease.TTL_MS.
    The start number counts the processes that have held this id in this run (0 for the first): with
    the id it makes the actor's seeds (`ActorSeeds`) differ from every other process's, restarts
    included. The lease is kept alive by a thread until `lease.release()`.

    Raises LeaseHeld naming the holder when the id asked for stays taken.
    """
    if actor_id is None:
        for candidate in range(MAX_ACTOR_ID):
            lease = LearnerLease(client, run, holder, role=f"actor:{candidate}", ttl_s=ttl_s)
            if lease.try_acquire():
                actor_id = candidate
                break
        else:
            raise LeaseHeld(f"run '{run}' has {MAX_ACTOR_ID} actors registered; none is free")
    else:
        lease = LearnerLease(client, run, holder, role=f"actor:{actor_id}", ttl_s=ttl_s)
        try:
            lease.acquire()
        except LeaseHeld:
            raise LeaseHeld(f"actor id {actor_id} of run '{run}' is taken by {lease.holder_now()}: two actors "
                            "with one id would play identical games; give another --actor-id, or leave "
                            "--actor-id out to take the lowest free id") from None
    start = int(client.incr(keys.actor_starts(run, actor_id))) - 1
    return lease, actor_id, start


@dataclass(frozen=True)
class ActorSeeds:
    """Every random stream of one actor process, all spawned from one numpy SeedSequence.

    The root is `SeedSequence(run.seed, spawn_key=(actor_id, start))`: child `actor_id` of run.seed's
    sequence, and its child `start` (the how-many-th process to hold that id in the run). Its four
    children seed: the envs (one child per env, whose child k seeds episode k; `envs.base.EpisodeSeeds`),
    action sampling (the torch generator), opponent draws (numpy), and the league's bots. Distinct
    (run seed, id, start, env, episode) give unrelated seeds, so no two streams overlap.
    """

    envs: tuple[np.random.SeedSequence, ...]
    actions: int  # torch.Generator seed
    opponents: np.random.SeedSequence
    bots: int

    @classmethod
    def spawn(cls, run_seed: int, actor_id: int, start: int, num_envs: int) -> "ActorSeeds":
        envs, actions, opponents, bots = np.random.SeedSequence(run_seed, spawn_key=(actor_id, start)).spawn(4)
        return cls(tuple(envs.spawn(num_envs)), int(actions.generate_state(1, np.uint64)[0] >> np.uint64(1)),
                   opponents, int(bots.generate_state(1)[0]))


def stacked(arrays: list[np.ndarray]) -> np.ndarray:
    """`np.stack(arrays)`, without its copy where `arrays` are the rows, in order, of one C-contiguous
    array: a vector env's observations (ale-py's AtariVectorEnv returns its N games' frame stacks as
    one [N, ...] array, and each slot's observation is a view of its row)."""
    base = arrays[0].base
    if not (isinstance(base, np.ndarray) and base.flags.c_contiguous and len(base) == len(arrays)
            and base.shape[1:] == arrays[0].shape and base.dtype == arrays[0].dtype):
        return np.stack(arrays)
    start, row = base.ctypes.data, base.strides[0]
    if all(a.base is base and a.ctypes.data == start + i * row for i, a in enumerate(arrays)):
        return base
    return np.stack(arrays)


@dataclass
class EnvSlot:
    """One env of an actor and what it carries from step to step: per agent of the env, the unroll
    under way of its learning stream, and the match of its episode. (A recurrent core's state per
    (env, agent) lives in `Actor.cores`, which batches it for the forward pass.)"""

    env: object  # the adapter (envs/): advance() and act(actions)
    buffers: list[UnrollBuffer]  # indexed by agent
    match: Match = field(default_factory=Match)


@dataclass
class LocalPolicy:
    """An actor's CPU copy of its learner's policy, and how it draws actions from it.

    `version` and `digest` name the weights loaded into `model` (as ParamStore.name does): the
    learner's policy version (-1 before the first weights) and the SHA-256 of their blob; after a
    learner's rollback one version number can name two sets of weights. Env i explores with
    `epsilons[i]`, spread evenly over [0, actor.epsilon]: some envs play the policy as it is, others see
    the positions that off-policy moves lead to.
    """

    model: torch.nn.Module  # in eval mode
    head: DiscreteHead | FunctionCallHead  # samples the learner's actions, plays a network opponent's
    epsilons: torch.Tensor  # [num_envs] float32
    rng: torch.Generator  # every action drawn, the learner's and the network opponents'
    version: int = -1
    digest: bytes | None = None

    @classmethod
    def build(cls, spec, cfg: Config, seed: int) -> "LocalPolicy":
        """The network of `cfg.agent` for env `spec`, before any weights are loaded; `seed` seeds `rng`."""
        model = make_model(spec, cfg.agent)
        model.eval()
        return cls(model, policy_head(spec), torch.linspace(0, cfg.actor.epsilon, cfg.actor.num_envs),
                   torch.Generator().manual_seed(seed))


@dataclass
class ActorCounters:
    """What an actor has done so far; the stream's counters are set from it with every add
    (`TrajectoryStream.add`).

    env_steps counts each env.step once (an adapter's `act`), whoever acted in it, learner or opponent;
    an env that repeats each action k times (a frame skip) would also count emulator frames, k per env
    step, here; no env of ours repeats actions.
    """

    sent: int = 0  # unrolls sent (A3C's workers: unrolls turned into gradients)
    env_steps: int = 0
    throttled_s: float = 0.0  # seconds waited for room in the stream (backpressure)
    backlog: int | None = None  # the stream's backlog in entries after our last add; None before it
    corrupt_weights: int = 0  # published weights refused for a SHA-256 mismatch


class ActorLink:
    """What an actor sends to and reads from Redis, its id lease aside: unrolls out on its trajectory
    shard, its learner's weights in, episode results out, and the run's done key.

    trajectories: the stream of this actor's shard (transport.shards: its own stream, backlog and
      high-water mark). params: its learner's weights, read from a read-only replica of the run's Redis
      where transport.params_urls names some (`params.replica`, named without its password by
      `params.replica_name`, "" without one). results: the run's results stream; finished episodes
      wait in `pending_results` and go in one round trip at most every RESULTS_EVERY_S (`report`).
      The done key is looked up at most every RUN_OVER_CHECK_S (`run_done`); `over` stays True once seen.
      Times (`results_sent_at`, `over_checked_at`) are time.monotonic() seconds.
    """

    def __init__(self, cfg: Config, client: redis.Redis, redis_url: str, actor_id: int, player: str):
        own = namespace(cfg.run.name, player)
        shard = actor_shard(actor_id, cfg.transport.shards)
        shard_url = shard_urls(redis_url, cfg.transport.shards, cfg.transport.shard_urls)[shard]
        shard_client = client if shard_url == redis_url else connect_shard(shard_url, retry_s=cfg.run.redis_retry_s)
        self.trajectories = TrajectoryStream(shard_client, own, shard=shard)
        self.results = ResultsStream(client, cfg.run.name)
        replica, replica_url = params_replica(redis_url, cfg.transport.params_urls, actor_id)
        self.params = ParamStore(client, own, delay=cfg.actor.weight_delay, replica=replica, replica_name=replica_url)
        self.redis, self.done_key = client, keys.done(cfg.run.name)
        self.pending_results: list[dict] = []
        self.results_sent_at = time.monotonic()
        self.over, self.over_checked_at = False, -math.inf

    def run_done(self) -> bool:
        """Is the run's done key set (looked up at most every RUN_OVER_CHECK_S)?"""
        now = time.monotonic()
        if not self.over and now - self.over_checked_at >= RUN_OVER_CHECK_S:
            self.over, self.over_checked_at = bool(self.redis.exists(self.done_key)), now
        return self.over

    def report(self, episodes: list[dict], flush: bool = False) -> None:
        """Queue episode results; send them when RESULTS_EVERY_S has passed since the last send, or now
        with `flush`."""
        self.pending_results += episodes
        if self.pending_results and (flush or time.monotonic() - self.results_sent_at >= RESULTS_EVERY_S):
            self.results.add_many(self.pending_results)
            self.pending_results, self.results_sent_at = [], time.monotonic()


class Actor:
    """Runs `cfg.actor.num_envs` envs of `cfg.env.name` for learner `player`; see `run` for the loop.

    Without a league every seat plays the latest weights and learns (self-play). With one, each env
    draws an opponent from the distribution the league manager publishes at every episode start:
    `self` (both seats learn) or a league member that plays one seat (chosen at random) while the
    learner plays and learns from the other.

    actor_id: the id asked for, or None for the lowest free one; either way it is registered in Redis
    for as long as the actor lives (`claim_actor_id`), and every random stream derives from it
    (`ActorSeeds`). `close()` gives it up.

    Its state: `slots` (one EnvSlot per env), `policy` (LocalPolicy: the network and how it acts),
    `cores` (recurrent states), `opponents` (the league's, and each episode's draw), `link` (ActorLink:
    streams, weights, results, the done key) and `counters` (ActorCounters).
    """

    def __init__(self, cfg: Config, redis_url: str, actor_id: int | None = None, player: str = MAIN,
                 bots: BotFactory | None = None):
        self.cfg = cfg
        self.player = player
        self.stopping = False
        self.stop_signal: int | None = None  # the signal that asked it to stop (SIGTERM, SIGINT), if one did
        self.redis = connect(redis_url, retry_s=cfg.run.redis_retry_s)  # first: a wrong URL fails before envs are built
        self.spec = env_spec(cfg.env.name, cfg.env.kwargs, cfg.env.seats)
        self.unroll_spec = UnrollSpec(self.spec, cfg.actor.unroll_length, core_size(cfg.agent))
        self.token = uuid.uuid4().hex[:8]  # unroll ids stay unique across restarts of this actor id
        # The id is this process's alone while it runs (see claim_actor_id); the seeds derive from it.
        self.identity, self.actor_id, self.start = claim_actor_id(
            self.redis, cfg.run.name, actor_id, f"{socket.gethostname()} pid {os.getpid()} ({self.token})",
            ttl_s=cfg.run.lease_ttl_s)
        self.seeds = ActorSeeds.spawn(cfg.run.seed, self.actor_id, self.start, cfg.actor.num_envs)
        # One adapter per env (with env.kwargs.emulator=ale_vector, the slots of one Atari vector env).
        envs = make_envs(cfg.env.name, self.seeds.envs, cfg.env.kwargs, seats=cfg.env.seats,
                         empty_mask=cfg.env.empty_mask)
        self.slots = [EnvSlot(env, [UnrollBuffer(self.unroll_spec, lambda: self.policy.version)
                                    for _ in self.spec.agents]) for env in envs]
        self.policy = LocalPolicy.build(self.spec, cfg, self.seeds.actions)
        # A recurrent core's input per (env, agent) slot, whoever plays it this episode: carried from
        # step to step and across unrolls, zeroed when the slot's episode ends.
        self.cores = CoreStates(core_size(cfg.agent)) if core_size(cfg.agent) else None
        self.link = ActorLink(cfg, self.redis, redis_url, self.actor_id, player)
        params = self.link.params  # a learner opponent's weights come from the same replica
        self.opponents = Opponents(self.redis, cfg, self.spec, player, self.seeds.bots, self.seeds.opponents, bots,
                                   replica=params.replica, replica_name=params.replica_name)
        self.counters = ActorCounters()

    @property
    def envs(self) -> list:
        """The env adapters, in slot order."""
        return [slot.env for slot in self.slots]

    def stop(self, signum: int | None = None, _frame: object = None) -> None:
        """Stop after the current step; a signal handler (`signum`: the signal, kept for the exit code)."""
        self.stopping = True
        self.stop_signal = self.stop_signal or signum

    def close(self) -> None:
        """Give up this actor's id (its lease would lapse by itself within 10 s)."""
        self.identity.release()

    def run_over(self) -> bool:
        """Told to stop, or the run's done key is set (looked up at most every RUN_OVER_CHECK_S)."""
        done = self.link.run_done()
        return self.stopping or done

    def report(self, episodes: list[dict], flush: bool = False) -> None:
        """Queue episode results; they are sent at most every RESULTS_EVERY_S (`ActorLink.report`)."""
        self.link.report(episodes, flush)

    def sync_params(self, wait: bool = False) -> None:
        """Load the latest published weights if their name changed, the version or the SHA-256 of the
        blob (waiting for the first ones): after a learner's rollback one version number can name two
        sets of weights (see distributed/wire/params.py). Weights that fail their SHA-256 are logged, counted
        (`counters.corrupt_weights`, and in Redis by ParamStore) and not loaded: the previous weights stay."""
        waited, start = False, time.monotonic()
        while True:
            if self.link.params.name() != (self.policy.version, self.policy.digest):
                try:
                    fetched = self.link.params.fetch()
                    if fetched is not None:
                        self.policy.model.load_state_dict(fetched[1])
                except WeightsCorrupt as e:
                    self.counters.corrupt_weights += 1
                    log.warning("actor %d keeps policy version %d: %s", self.actor_id, self.policy.version, e)
                    fetched = None
                except (RuntimeError, ValueError, SafetensorError) as e:
                    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
                    detail = lines[1] if len(lines) > 1 else (lines[0] if lines else type(e).__name__)
                    raise ConfigError(f"the weights published under '{self.link.params.key}' do not fit this actor's "
                                      f"network: does its config (env.name, agent.*) match the learner's? ({detail})"
                                      ) from None
                if fetched is not None:
                    if fetched[0] <= self.policy.version:
                        log.warning("actor %d: the weights published as policy version %d replace version %d "
                                    "(the learner resumed from an older checkpoint, or the league reset it)",
                                    self.actor_id, fetched[0], self.policy.version)
                    self.policy.version, self.policy.digest = fetched[0], self.link.params.fetched_digest
                    return
            if not wait or self.run_over():
                return
            if not waited and time.monotonic() - start > 5:
                log.info("actor %d: waiting for the learner to publish weights under '%s'", self.actor_id,
                         self.link.params.key)
                waited = True
            time.sleep(0.2)

    def refresh_opponents(self) -> None:
        """Re-read the league's opponent distribution for this player and the opponents' latest weights."""
        if not self.cfg.league.enabled:
            return
        try:
            self.opponents.read_distribution()
        except ValueError as e:
            log.warning("actor %d: %s; keeping the previous distribution", self.actor_id, e)
        self.opponents.refresh()

    def start_episode(self, i: int) -> None:
        """Draw env i's match for the episode that starts now (self-play when there is no league yet)."""
        self.slots[i].match = self.opponents.draw({slot.match.opponent for slot in self.slots})

    def learns(self, i: int, agent: int) -> bool:
        """Is agent `agent` of env i a learning stream (it plays the learner's seat this episode)?"""
        return self.slots[i].match.learner_seat in (-1, self.spec.agent_seats[agent])

    def run(self) -> None:
        """The actor loop: observe all envs, one forward pass per policy to move, act, send finished unrolls."""
        self.sync_params(wait=True)
        self.refresh_opponents()
        log.info("actor %d (pid %d): %d x %s, policy version %d, playing for %s%s", self.actor_id, os.getpid(),
                 len(self.slots), self.spec.name, self.policy.version, self.player,
                 f", weights from replica {self.link.params.replica_name}" if self.link.params.replica else "")
        steps = [slot.env.advance() for slot in self.slots]
        for i in range(len(self.slots)):
            self.start_episode(i)
        unrolls: list[dict[str, np.ndarray]] = []  # finished, not sent yet
        versions: list[int] = []  # of each: the policy version that chose its step 0's action
        while not self.stopping:
            episodes = []
            for i, step in enumerate(steps):
                for s in step.settlements:  # they all belong to the episode the opponent was drawn for
                    if self.learns(i, s.agent):
                        self.slots[i].buffers[s.agent].settle(s.reward, s.done, s.truncated, s.final_observation)
                    if self.cores is not None:
                        if s.done or s.truncated:
                            self.cores.reset((i, s.agent))
                        else:
                            self.cores.add_reward((i, s.agent), s.reward)
                if step.episodes:
                    episodes += [self.result(i, e) for e in step.episodes]
                    self.start_episode(i)
                for agent, obs, mask in zip(step.agents, step.observations, step.action_masks):
                    if self.learns(i, agent):
                        buffer = self.slots[i].buffers[agent]
                        unroll = buffer.observe(obs, mask, self.core_record(i, agent))
                        if unroll is not None:
                            unrolls.append(unroll)
                            versions.append(buffer.finished_version)
            self.report(episodes)
            if len(unrolls) >= self.cfg.actor.send_batch:  # whole entries of send_batch; the rest waits
                ready = len(unrolls) - len(unrolls) % self.cfg.actor.send_batch
                if self.send(unrolls[:ready], versions[:ready]):
                    self.report([], flush=True)
                    return
                unrolls, versions = unrolls[ready:], versions[ready:]
            actions = self.choose_actions(steps)
            # Every env acts before any advances: the slots of one Atari vector env step together (make_envs).
            for slot, action in zip(self.slots, actions):
                slot.env.act(action)
            steps = [slot.env.advance() for slot in self.slots]
            self.counters.env_steps += len(self.slots)

    def core_record(self, i: int, agent: int) -> tuple[np.ndarray, int, float] | None:
        """What an unroll of env i's agent keeps of its core input before this step (None: no core)."""
        if self.cores is None:
            return None
        state, last_action, last_reward = self.cores.get((i, agent))
        return state.numpy(), last_action, last_reward

    def choose_actions(self, steps: list) -> list[list[int]]:
        """Per env, one action per acting agent: the learner's (recorded in its unroll buffer) or its
        opponent's. Each policy moves all its agents of all envs in one forward pass."""
        head, rng = self.policy.head, self.policy.rng
        actions = [[0] * len(step.agents) for step in steps]
        learning: list[tuple[int, int]] = []  # (env, index into the env's acting agents)
        by_opponent: dict[int, list[tuple[int, int]]] = {}  # by the policy object: one forward pass each
        for i, step in enumerate(steps):
            for k, agent in enumerate(step.agents):
                if self.learns(i, agent):
                    learning.append((i, k))
                else:
                    by_opponent.setdefault(id(self.slots[i].match.policy), []).append((i, k))
        if learning:
            obs, masks = self.stack(steps, learning)
            keys = self.core_keys(steps, learning)
            logits, state = self.forward(self.policy.model, obs, masks, keys)
            drawn, behaviour = head.sample(logits, masks, self.policy.epsilons[[i for i, _ in learning]], rng)
            self.advance_cores(keys, state, drawn)
            chosen, behaviour_np = drawn.numpy(), behaviour.numpy()
            for n, (i, k) in enumerate(learning):
                self.slots[i].buffers[steps[i].agents[k]].record_action(chosen[n], behaviour_np[n])
                actions[i][k] = chosen[n]
        for pairs in by_opponent.values():
            policy = self.slots[pairs[0][0]].match.policy
            if isinstance(policy, torch.nn.Module):
                obs, masks = self.stack(steps, pairs)
                keys = self.core_keys(steps, pairs)
                logits, state = self.forward(policy, obs, masks, keys)
                drawn = head.play(logits, rng, self.cfg.league.opponent_temperature)
                self.advance_cores(keys, state, drawn)
                chosen = drawn.numpy()
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
            obs = torch.from_numpy(stacked(observations))
        return obs, torch.from_numpy(np.stack([steps[i].action_masks[k] for i, k in pairs]))

    def core_keys(self, steps: list, pairs: list[tuple[int, int]]) -> list[tuple[int, int]] | None:
        """The (env, agent) slots of acting agents `pairs` (env, index), whose core states a step reads
        and advances; None without a core (nothing is built on the feedforward path)."""
        return None if self.cores is None else [(i, steps[i].agents[k]) for i, k in pairs]

    def forward(self, model: torch.nn.Module, obs, masks: torch.Tensor,
                keys: list[tuple[int, int]] | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`model`'s logits for the agents in slots `keys` (`core_keys`) and, with a core, their states
        after this step (None without)."""
        with torch.no_grad():
            logits, _, state = model.step(obs, masks, None if keys is None else self.cores.gather(keys))
        return logits, state

    def advance_cores(self, keys: list[tuple[int, int]], state: torch.Tensor | None, drawn: torch.Tensor) -> None:
        """Carry the slots' core states past the actions `drawn` ([N], or [N, H]: head 0 is fed back)."""
        if state is not None:
            self.cores.advance(keys, state, (drawn if drawn.dim() == 1 else drawn[:, 0]).tolist())

    def send(self, unrolls: list[dict[str, np.ndarray]], versions: list[int] | None = None) -> bool:
        """XADD finished unrolls, `actor.send_batch` to a stream entry, after waiting for room; sync
        params on schedule. True = run is over. versions: per unroll, the policy version that chose
        its step 0's action (UnrollBuffer; None: the version held now); an entry is stamped with the
        oldest of its unrolls', so that its policy lag is that of the oldest weights that acted in it,
        not of those held when it is sent."""
        versions = [self.policy.version] * len(unrolls) if versions is None else versions
        per_entry, stream, counters = self.cfg.actor.send_batch, self.link.trajectories, self.counters
        counters.throttled_s += stream.wait_for_room(-(-self.cfg.actor.high_water_mark // per_entry), self.run_over,
                                                     backlog=counters.backlog)
        if self.run_over():
            return True
        payloads = []
        for first in range(0, len(unrolls), per_entry):
            payloads.append(encode_unrolls(unrolls[first:first + per_entry],
                                           unroll_id=f"{self.actor_id}-{self.token}-{counters.sent + first}",
                                           policy_version=min(versions[first:first + per_entry]),
                                           actor_id=self.actor_id, env=self.spec.name,
                                           compression=self.cfg.transport.compression,
                                           level=self.cfg.transport.compression_level))
        counters.sent += len(unrolls)
        counters.backlog = stream.add(payloads, producer=f"{self.actor_id}-{self.token}", produced=counters.sent,
                                      throttled_s=counters.throttled_s, env_steps=counters.env_steps)
        every = self.cfg.actor.param_sync_every
        if counters.sent // every != (counters.sent - len(unrolls)) // every:
            self.sync_params()
            self.refresh_opponents()
        return False

    def result(self, i: int, episode) -> dict:
        """The report of a finished episode of env i, for the learner's metrics and the league's payoff.
        An episode with a non-finite return (a NaN or infinite reward; its unrolls are dead-lettered) is
        reported as `nonfinite` with no returns and no winner: the learner counts it and the league
        leaves it out, so no statistic and no rating is made from it."""
        returns = [float(r) for r in episode.returns]
        finite = all(math.isfinite(r) for r in returns)
        match = self.slots[i].match
        report = {"actor_id": self.actor_id, "player": self.player, "policy_version": self.policy.version,
                  "opponent_id": match.opponent, "opponent_version": match.version,
                  "learner_seat": match.learner_seat,
                  "winner": -1 if episode.winner is None or not finite else episode.winner, "length": episode.length,
                  "returns": returns if finite else []}
        if not finite:
            report["nonfinite"] = True
        return report


def run_actor(cfg: Config, redis_url: str, actor_id: int | None, player: str = MAIN,
              actor_class: type = Actor, bots: BotFactory | None = None) -> int:
    """Entry point of `run.py actor` (`actor_class`: Actor, or a subclass such as A3C's worker): one
    thread for torch, stop cleanly on SIGTERM/SIGINT. actor_id None: the lowest free id of the run.
    `bots` makes the league's baseline bots (evaluation.bots.league_bot; None: none are played).
    Returns the exit code: 0 once the run is over, 128 + N when signal N stopped it before
    (`stopped_exit_code`). Raises RedisUnavailable when Redis stays lost."""
    torch.set_num_threads(1)
    keep_freed_memory()
    actor = actor_class(cfg, redis_url, actor_id, player, bots)
    # Redis lost: no release of the id, it would wait out the retries again; its lease lapses in 10 s.
    code = run_role(actor, lambda e: f"actor {actor.actor_id} lost Redis: {type(e).__name__}: {e}",
                    lambda: actor.link.over or run_is_over(actor.redis, cfg.run.name))
    actor.close()
    log.info("actor %d (pid %d): sent %d unrolls, stopping", actor.actor_id, os.getpid(), actor.counters.sent)
    return code
