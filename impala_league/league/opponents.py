"""The league's opponents as an actor plays them: the policies by league id, loaded on first use and
cached (`Opponents`), and the match of each episode drawn from the distribution the league manager
publishes for the actor's learner (`Opponents.draw` -> `Match`)."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np
import redis
import torch
from safetensors import SafetensorError

from impala_league.agents.model import make_model
from impala_league.config import Config
from impala_league.distributed.wire.codec import WeightsCorrupt, decode_weights
from impala_league.distributed.wire.params import ParamStore
from impala_league.league.matchmaking import SELF
from impala_league.league.players import PLAYER_ID, SNAPSHOT_ID, namespace
from impala_league.league.store import LeagueStore

log = logging.getLogger("actor")

# (league member id, env name, seed) -> that member's bot, or None when the id names no bot kind.
BotFactory = Callable[[str, str, int], object | None]

ASK_AGAIN_S = 5.0
"""An actor asks the league manager for a snapshot Redis does not hold at most once per this many seconds."""
PENDING_S = 30.0
"""How long an actor looks out for a snapshot it asked for, to fetch it at its parameter syncs."""


@dataclass
class Match:
    """Who plays an env's other seats in the episode under way: drawn at its start (`Actor.start_episode`)
    and kept until it ends, so that a weight swap waits for the next episode."""

    opponent: str = SELF  # a league member's id, or SELF: every seat is the learner's
    policy: object | None = None  # the network or bot that moves for the opponent; None in self-play
    version: str = SELF  # the exact weights it plays (`Opponents.version`)
    learner_seat: int = -1  # the seat the learner plays and learns from; -1 = every seat (self-play)


@dataclass
class LearnerWeights:
    """Another learner's weights as an actor plays them: where they come from, the version and SHA-256
    loaded (`ParamStore.name`: a changed pair means new weights), and the model made of them."""

    store: ParamStore
    version: int
    digest: bytes | None
    model: torch.nn.Module


class Opponents:
    """The policies that play a learner's opponents, by id, loaded on first use and cached.

    Ids: a learner id (`main`, ...) = that learner's latest published weights (`learners`: id ->
    LearnerWeights), re-read by `refresh` into a new model (the one a running game holds is never changed
    under it); a snapshot id = frozen
    weights from the league store (beyond `league.opponent_cache` of them, the least recently used
    one is dropped from the cache; see "Evicted snapshots" below); an id that `bots` makes a bot of (`random`, `tactical`, `minimax:D`:
    evaluation.bots.league_bot, handed in by run.py) = that bot.
    `get` returns None when an id cannot be played (unknown, corrupt, or not fitting this network)
    and logs why once; the actor then plays that episode as self-play. `version` names the exact
    weights `get` returns: the snapshot id or bot spec itself, or `<learner>@<version>`.

    The draws: `distribution` is the league's opponent distribution for learner `player` as last read
    (`read_distribution`; None before the first, or while none is published), and `rng` draws every
    episode's opponent and seat from it (seeded by `draw_seed`, the actor's `ActorSeeds.opponents`).

    Evicted snapshots: Redis holds the weights of at most `league.redis_snapshots` snapshots
    (league/residency.py; `resident` is their set as last read). A drawn snapshot Redis does not hold is
    asked for (`LeagueStore.want`, at most every ASK_AGAIN_S; `pending`), counted in `unavailable`, and
    that game is played against another league member drawn from the distribution among those playable
    now (not self-play: the league's share of games stays the league's; self-play if none is);
    `refresh` fetches a pending snapshot into the cache once Redis holds it again, so its next draw
    plays it. Weights are only ever played under their own id.
    """

    def __init__(self, client: redis.Redis, cfg: Config, spec, player: str, seed: int,
                 draw_seed: np.random.SeedSequence, bots: BotFactory | None = None,
                 replica: redis.Redis | None = None, replica_name: str = "replica"):
        # Other learners' weights: from the run's Redis, or its read-only replica.
        self._param_store = partial(ParamStore, client, replica=replica, replica_name=replica_name)
        self.cfg = cfg
        self.spec = spec
        self.player = player
        self.seed = seed  # of the bots
        self.rng = np.random.default_rng(draw_seed)
        self.distribution: dict[str, float] | None = None
        self.make_bot = bots
        self.store = LeagueStore(client, cfg.run.name)
        self.snapshots: OrderedDict[str, torch.nn.Module] = OrderedDict()
        self.learners: dict[str, LearnerWeights] = {}
        self.bots: dict[str, object] = {}
        self.failed: set[str] = set()
        self.corrupt = 0  # weight blobs refused for a SHA-256 mismatch
        self.resident: set[str] | None = None  # snapshots whose weights Redis holds, as last read
        self.pending: dict[str, float] = {}  # snapshots asked for -> monotonic time of the latest ask
        self.unavailable = 0  # draws of a snapshot Redis did not hold
        self._fixed: tuple[dict | None, dict[str, float]] = (None, {})  # (distribution, its ids that are no snapshot)

    def _model(self, state_dict: dict[str, torch.Tensor]) -> torch.nn.Module:
        model = make_model(self.spec, self.cfg.agent)
        model.load_state_dict(state_dict)
        return model.eval()

    def _fail(self, opponent_id: str, why: str) -> None:
        if opponent_id not in self.failed:
            log.warning("opponent %r cannot be played (%s); playing those episodes against the latest weights",
                        opponent_id, why)
            self.failed.add(opponent_id)

    def version(self, opponent_id: str) -> str:
        """The exact weights `get(opponent_id)` returns now: `<learner>@<version>` for a learner, the
        id itself for a snapshot (frozen) or a bot."""
        if opponent_id in self.learners:
            return f"{opponent_id}@{self.learners[opponent_id].version}"
        return opponent_id

    def get(self, opponent_id: str, in_use: set[str] = frozenset()):
        """A network or a bot for `opponent_id`, or None (see the class doc). Snapshots in
        `in_use` are kept in the cache (a running game holds its own reference either way)."""
        if opponent_id in self.snapshots:
            self.snapshots.move_to_end(opponent_id)
            return self.snapshots[opponent_id]
        if opponent_id in self.learners:
            return self.learners[opponent_id].model
        if opponent_id in self.bots:
            return self.bots[opponent_id]
        if opponent_id in self.failed:
            return None
        try:
            bot = self.make_bot(opponent_id, self.spec.name, self.seed) if self.make_bot is not None else None
            if bot is not None:
                self.bots[opponent_id] = bot
                return bot
            if PLAYER_ID.fullmatch(opponent_id):
                store = self._param_store(namespace(self.cfg.run.name, opponent_id))
                try:
                    fetched = store.fetch()
                except WeightsCorrupt as e:
                    self.corrupt += 1
                    log.warning("opponent %r not loaded: %s", opponent_id, e)
                    return None  # tried again at its next draw
                if fetched is None:
                    return None  # that learner has not published yet: not a failure
                weights = LearnerWeights(store, fetched[0], store.fetched_digest, self._model(fetched[1]))
                self.learners[opponent_id] = weights
                return weights.model
            try:
                data = self.store.snapshot(opponent_id)
            except WeightsCorrupt:
                self.corrupt += 1
                raise
            if data is None:
                if SNAPSHOT_ID.fullmatch(opponent_id):
                    self._ask(opponent_id)
                else:
                    self._fail(opponent_id, f"no snapshot under {self.store.snapshot_key(opponent_id)}")
                return None
            self.pending.pop(opponent_id, None)
            self.snapshots[opponent_id] = self._model(decode_weights(data))
        except (ValueError, RuntimeError, SafetensorError) as e:
            self._fail(opponent_id, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            return None
        idle = [s for s in self.snapshots if s not in in_use and s != opponent_id]
        for dropped in idle[:max(0, len(self.snapshots) - self.cfg.league.opponent_cache)]:
            del self.snapshots[dropped]
        return self.snapshots[opponent_id]

    def _ask(self, snapshot_id: str) -> None:
        """Redis does not hold `snapshot_id` now (evicted): ask the league manager for it."""
        self.unavailable += 1
        now = time.monotonic()
        if now - self.pending.get(snapshot_id, float("-inf")) >= ASK_AGAIN_S:
            self.store.want(snapshot_id)
            self.pending[snapshot_id] = now
            log.debug("snapshot %r is not in Redis now; asked the league manager for it", snapshot_id)

    def fetch_pending(self) -> None:
        """Fetch into the cache the snapshots asked for that Redis holds again, the latest asked first and
        at most a quarter of `league.opponent_cache` per call (each evicts the least recently used);
        forget asks older than PENDING_S (the next draw asks again)."""
        now = time.monotonic()
        self.pending = {s: t for s, t in self.pending.items() if s not in self.snapshots and now - t <= PENDING_S}
        ready = [s for s in sorted(self.pending, key=self.pending.get, reverse=True) if s in (self.resident or ())]
        for snapshot_id in ready[:max(1, self.cfg.league.opponent_cache // 4)]:
            self.get(snapshot_id)

    def refresh(self) -> None:
        """Load the latest weights of the learners played against, where their name changed, into
        new models: games in progress keep the model they started with (one opponent per game).
        Weights failing their SHA-256 are logged and counted, and the previous ones kept. Then
        `fetch_pending`."""
        self.fetch_pending()
        for opponent_id, loaded in list(self.learners.items()):
            store, version = loaded.store, loaded.version
            # A new version, or the same number naming other weights (a rollback; see distributed/wire/params.py).
            if store.name() != (version, loaded.digest):
                try:
                    fetched = store.fetch()
                except WeightsCorrupt as e:
                    self.corrupt += 1
                    log.warning("opponent %r keeps version %d: %s", opponent_id, version, e)
                    continue
                if fetched is not None:
                    try:
                        model = self._model(fetched[1])
                    except RuntimeError as e:
                        self._fail(opponent_id, f"weights do not fit: {str(e).splitlines()[0]}")
                        del self.learners[opponent_id]
                        continue
                    self.learners[opponent_id] = LearnerWeights(store, fetched[0], store.fetched_digest, model)

    def read_distribution(self) -> None:
        """Re-read the league's opponent distribution for `player`. Raises ValueError when the stored one
        is malformed (LeagueStore.opponents); the previous one is then kept. Also re-reads `resident`."""
        self.resident = self.store.resident()
        self.distribution = self.store.opponents(self.player)

    def draw(self, in_use: set[str]) -> Match:
        """The match of an episode that starts now: an opponent id drawn from `distribution` (None or
        empty: self-play) and a seat for the learner drawn uniformly. Self-play when the draw is `self`
        or the learner itself, or when the drawn member cannot be played (`get` returns None). A drawn
        snapshot Redis does not hold is asked for, and the game drawn again among the league members
        playable now (see the class doc). `in_use`: the opponent ids of games under way, kept in the snapshot cache."""
        if not self.distribution:
            return Match()
        drawn, policy = self._pick(self.distribution, in_use)
        if policy is None and drawn in self.pending:
            now = {k: p for k, p in self._playable_now(drawn).items() if k not in (SELF, self.player)}
            if now:
                drawn, policy = self._pick(now, in_use)
        if policy is None:
            return Match()
        return Match(drawn, policy, self.version(drawn), int(self.rng.integers(len(self.spec.seats))))

    def _pick(self, distribution: dict[str, float], in_use: set[str]) -> tuple[str, object | None]:
        """An id drawn from `distribution` (probabilities, summing to 1 or not) and its policy (None for
        self-play or an id that cannot be played now)."""
        ids = list(distribution)
        p = np.array(list(distribution.values()))
        drawn = ids[self.rng.choice(len(ids), p=p / p.sum())]
        return drawn, None if drawn in (SELF, self.player) else self.get(drawn, in_use)

    def _playable_now(self, drawn: str) -> dict[str, float]:
        """`distribution` without `drawn`, restricted to what can be played without waiting: self-play,
        learners and bots, cached snapshots, and those Redis held at the last `read_distribution` (a
        few dozen lookups, however many snapshots the league holds)."""
        dist = self.distribution or {}
        if self._fixed[0] is not dist:
            self._fixed = (dist, {k: p for k, p in dist.items() if not SNAPSHOT_ID.fullmatch(k)})
        out = dict(self._fixed[1])
        for s in (*self.snapshots, *(self.resident or ())):
            if s in dist:
                out[s] = dist[s]
        return {k: p for k, p in out.items() if k != drawn and k not in self.failed}
