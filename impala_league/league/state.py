"""The league's state and rules, without Redis or files: who is a member, who beats whom, when a learner
is frozen, and whom each learner plays.

`LeagueState` holds the members (`Member` records: learners, snapshots, baseline bots), the payoff table
and Elo ratings (league/payoff.py), each learner's latest snapshot, and the opponent distributions
(league/matchmaking.py: PFSP and AlphaStar's roles, Vinyals et al. 2019). It decides; the league manager
(league/manager.py) reads episode results and learners' weights from Redis, feeds them in, and writes what
it decides (snapshot files and weights, distributions, resets, state.json, ratings.jsonl).

`to_json` / `restore` are state.json's league part (format `STATE_VERSION`); `Member.to_json` is also the
`meta` of a snapshot's checkpoint file, which `restore`'s caller adopts after a crash (`add_snapshot`).
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import Iterable

from impala_league.config import LeagueConfig
from impala_league.league.matchmaking import (SELF, league_exploiter_opponents, main_agent_opponents,
                                              main_exploiter_opponents)
from impala_league.league.payoff import EloRatings, PayoffTable, episode_score
from impala_league.league.players import MAIN, PLAYER_ID, SNAPSHOT_ID, role
from impala_league.records import upgraded

STATE_VERSION = 1
KINDS = ("learner", "snapshot", "bot")


def single_opponent(result: dict) -> bool:
    """Was the result's game played by one opponent version throughout? Actors pin the opponent's
    weights for a whole game and name them in `opponent_version`: the snapshot id or bot spec itself,
    or `<learner>@<version>`. A result without it (or naming another opponent) is not scored."""
    opponent, version = result.get("opponent_id"), result.get("opponent_version")
    if not isinstance(opponent, str) or not isinstance(version, str):
        return False
    if PLAYER_ID.fullmatch(opponent):  # a learner: its weights change, so the version is required
        return re.fullmatch(rf"{re.escape(opponent)}@\d+", version) is not None
    return version == opponent


def snapshot_id(player: str, step: int) -> str:
    """The id of learner `player`'s snapshot at update `step`: `<player>-<step, 7 digits or more>`."""
    return f"{player}-{step:07d}"


@dataclass
class Member:
    """One league member.

    id: the member's id (`main`, `main_exploiter_0`; `main-0000400`; `random`, `minimax:2`).
    kind: `learner` (weights still training), `snapshot` (frozen weights of a learner) or `bot`.
    role: the learner's role (`main`, `main_exploiter`, `league_exploiter`); None for a bot.
    For snapshots only: player (the learner frozen), step (its update count then), agent_steps (its
    agent steps trained then), parent (the previous snapshot of that learner; None after a reset or for the
    first), created (unix seconds).
    """

    id: str
    kind: str
    role: str | None = None
    player: str | None = None
    step: int = 0
    agent_steps: int = 0
    parent: str | None = None
    created: float = 0.0

    @property
    def frozen(self) -> bool:
        """Whether PFSP may draw it: a snapshot or a bot (a learner's weights keep changing)."""
        return self.kind in ("snapshot", "bot")

    def to_json(self) -> dict:
        """The member as state.json (and a snapshot file's `meta`) hold it: `{"kind": "bot"}`,
        `{"kind": "learner", "role": ...}`, or a snapshot's eight keys."""
        if self.kind == "bot":
            return {"kind": "bot"}
        if self.kind == "learner":
            return {"kind": "learner", "role": self.role}
        return {"kind": "snapshot", "id": self.id, "player": self.player, "role": self.role, "step": self.step,
                "agent_steps_trained": self.agent_steps, "parent": self.parent, "created": self.created}

    @classmethod
    def from_json(cls, member_id: str, info: dict) -> "Member":
        """The member `to_json` wrote (now or under older key names, `records.upgraded`). Raises ValueError
        unless it is a well-formed snapshot (id and player valid ids, an integer step), learner or bot."""
        info = upgraded(info) if isinstance(info, dict) else info
        kind = info.get("kind") if isinstance(info, dict) else None
        if kind not in KINDS:
            raise ValueError(f"member {member_id!r} has no valid kind")
        if kind == "bot":
            return cls(member_id, kind)
        if kind == "learner":
            return cls(member_id, kind, role=info.get("role"))
        player = info.get("player")
        if not SNAPSHOT_ID.fullmatch(member_id) or not isinstance(player, str) or not PLAYER_ID.fullmatch(player):
            raise ValueError(f"snapshot {member_id!r} has a malformed id or player")
        try:
            return cls(member_id, kind, role=info.get("role", role(player)), player=player, step=int(info["step"]),
                       agent_steps=int(info.get("agent_steps_trained") or 0), parent=info.get("parent"),
                       created=float(info.get("created") or 0.0))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"snapshot {member_id!r} has no valid step, agent steps or created ({e})") from None


class LeagueState:
    """The league of one run: members, payoff, Elo, snapshots, opponent distributions. No I/O.

    Args:
      cfg: the league config (`league.*`: the bots, the payoff's decay and min_games, the Elo K, the
        snapshot and reset rules, the PFSP mixes).
      learners: the run's learner ids (league/players.py `learner_players`), main first.
      env: the env's name (state.json names it; another env's state is refused).
      seats: the env's number of seats (a result's `learner_seat` outside 0..seats-1 counts pooled only).
      seed: seeds the draw that decides whether a league exploiter is reset (`run.seed`).

    Attributes: `members` (id -> Member: learners, bots, then snapshots as added), `payoff`, `elo`,
    `last_snapshot` (learner -> update of its latest snapshot or reset), `lineage` (learner -> its latest
    snapshot, None after a reset), `games` (results scored), `skipped` (results not scored: unknown
    players, unpinned opponents, unreadable, non-finite), `evicted_games` (games scored against a
    snapshot Redis had evicted before), `dropped` (snapshots that left: id -> why), `distributions`
    (as last computed by `update_distributions`).
    """

    def __init__(self, cfg: LeagueConfig, learners: list[str], env: str, seats: int, seed: int = 0):
        self.cfg = cfg
        self.env, self.seats = env, seats
        self.learners = list(learners)
        self.payoff = PayoffTable(decay=cfg.payoff_decay, min_games=cfg.min_games)
        self.elo = EloRatings(k=cfg.elo_k)
        self.members: dict[str, Member] = {p: Member(p, "learner", role(p)) for p in self.learners}
        self.members.update({b: Member(b, "bot") for b in cfg.bots})
        self.last_snapshot = {p: 0 for p in self.learners}
        self.lineage: dict[str, str | None] = {p: None for p in self.learners}
        self.games = self.skipped = self.evicted_games = 0
        self.dropped: dict[str, str] = {}
        self.distributions: dict[str, dict[str, float]] = {}
        self.rng = random.Random(seed)

    # -- members -----------------------------------------------------------------------------------
    def snapshots(self, player: str | None = None) -> list[str]:
        """Snapshot ids (of learner `player`, or of all), in the order they joined."""
        return [m for m, info in self.members.items()
                if info.kind == "snapshot" and (player is None or info.player == player)]

    def frozen(self) -> list[str]:
        """The league that PFSP draws from: every snapshot and every bot."""
        return [m for m, info in self.members.items() if info.frozen]

    def drop(self, member_id: str, why: str) -> None:
        """A snapshot leaves the league (its file is missing or corrupt); `why` is kept in `dropped`."""
        self.members.pop(member_id, None)
        self.dropped[member_id] = why

    # -- results -----------------------------------------------------------------------------------
    def score(self, results: Iterable[dict], unreadable: int = 0, evicted: set[str] = frozenset()) -> int:
        """Fold episode results (as actors report them, results stream) into the payoff and Elo; returns
        how many counted. Self-play results are passed over; non-finite ones, unknown players, games of a
        learner against itself and games not played by one opponent version (`single_opponent`) are
        counted in `skipped`, with `unreadable` entries the caller could not decode. `evicted`: snapshot
        ids Redis evicted at least once (their games are counted in `evicted_games`)."""
        counted = 0
        for r in results:
            player, opponent = r.get("player", MAIN), r.get("opponent_id", SELF)
            if opponent == SELF:
                continue  # self-play says nothing about who is stronger
            if (r.get("nonfinite") or player not in self.learners or opponent not in self.members
                    or player == opponent or not single_opponent(r)):
                self.skipped += 1  # a NaN return decides no game; the rest names no scored pair
                continue
            score = episode_score(r)
            seat = r.get("learner_seat", -1)
            self.payoff.add(player, opponent, score, seat if isinstance(seat, int) and 0 <= seat < self.seats else None)
            self.elo.update(player, opponent, score)
            counted += 1
            self.evicted_games += opponent in evicted
        self.skipped += unreadable
        self.games += counted
        return counted

    # -- snapshots and resets ----------------------------------------------------------------------
    def due_snapshot(self, player: str, step: int) -> str | None:
        """Why `player` at update `step` should be frozen now, or None (AlphaStar's pseudocode,
        `ready_to_checkpoint` of each role).

        main: every `snapshot_every` updates, or when it beats every frozen member at
        `snapshot_win_rate` (win rates below `min_games` games do not count).
        main exploiter: when it beats the main agent at `exploiter_reset_win_rate`, or 2 x
        `snapshot_every` updates after its last reset; it is then reset.
        league exploiter: when it beats every frozen member at `snapshot_win_rate`, or 2 x
        `snapshot_every` updates; then reset with probability `league_exploiter_reset_prob`.
        """
        league = self.cfg
        since = step - self.last_snapshot[player]
        if since <= 0:
            return None
        kind = role(player)
        if since >= league.snapshot_every * (1 if kind == MAIN else 2):
            return f"{since} updates since the last snapshot"
        if kind == "main_exploiter":
            w = self.payoff.win_rate(player, MAIN)
            if w is not None and w >= league.exploiter_reset_win_rate:
                return f"beats the main agent {w:.0%}"
            return None
        others = self.frozen()
        rates = [self.payoff.win_rate(player, m) for m in others]
        if others and all(w is not None and w >= league.snapshot_win_rate for w in rates):
            return f"beats all {len(others)} league members at >= {league.snapshot_win_rate:.0%}"
        return None

    def new_snapshot(self, player: str, step: int, agent_steps: int, created: float) -> Member | None:
        """The record of `player`'s snapshot at update `step` (`agent_steps` trained, `created` unix
        seconds), its parent the learner's latest snapshot; None when that snapshot exists already.
        Not yet a member: `add_snapshot` makes it one once its weights are stored."""
        member_id = snapshot_id(player, step)
        if member_id in self.members:
            return None
        return Member(member_id, "snapshot", role(player), player, step, agent_steps, self.lineage[player], created)

    def add_snapshot(self, member: Member) -> None:
        """Make `member` (a snapshot) a member: its Elo starts as its learner's; it becomes the learner's
        latest snapshot unless a later one is (a file adopted on resume may be older).

        Raises ValueError for a member that is no snapshot of one of the run's learners, or already is one."""
        if member.kind != "snapshot" or member.player not in self.learners:
            raise ValueError(f"{member.id!r} is no snapshot of a learner of this run ({', '.join(self.learners)})")
        if member.id in self.members:
            raise ValueError(f"{member.id!r} is a league member already")
        self.members[member.id] = member
        self.elo.copy_to(member.player, member.id)
        if member.step >= self.last_snapshot[member.player]:
            self.last_snapshot[member.player] = member.step
            self.lineage[member.player] = member.id

    def resets_after_snapshot(self, player: str) -> bool:
        """Whether `player` starts again from fresh weights after its snapshot: a main exploiter always,
        a league exploiter with probability `league_exploiter_reset_prob` (AlphaStar), the main agent never."""
        kind = role(player)
        return kind == "main_exploiter" or (
            kind == "league_exploiter" and self.rng.random() < self.cfg.league_exploiter_reset_prob)

    def reset(self, player: str, step: int) -> None:
        """`player`'s learner starts again at update `step`: its results and rating are forgotten and its
        next snapshot has no parent."""
        self.payoff.remove(player)
        self.elo.ratings.pop(player, None)
        self.last_snapshot[player] = step
        self.lineage[player] = None

    # -- matchmaking -------------------------------------------------------------------------------
    def distribution(self, player: str) -> dict[str, float]:
        """Learner `player`'s opponent distribution {id: probability} by its role (league/matchmaking.py)."""
        kind = role(player)
        if kind == MAIN:
            return main_agent_opponents(player, self.payoff, self.frozen(), self.snapshots(player), self.cfg,
                                        self.cfg.bots)
        if kind == "main_exploiter":
            return main_exploiter_opponents(player, self.payoff, self.snapshots(MAIN), self.cfg)
        return league_exploiter_opponents(player, self.payoff, self.frozen(), self.cfg)

    def update_distributions(self) -> dict[str, dict[str, float]]:
        """Every learner's distribution, computed now and kept in `distributions`; returns them."""
        self.distributions = {p: self.distribution(p) for p in self.learners}
        return self.distributions

    def residency_inputs(self) -> tuple[dict[str, float], list[str], dict[str, float]]:
        """(every snapshot's creation time, the newest snapshot of each learner, each snapshot's summed
        probability in the distributions), as league/residency.py takes them."""
        created: dict[str, float] = {}
        newest: dict[str, Member] = {}
        for member_id, info in self.members.items():
            if info.kind == "snapshot":
                created[member_id] = info.created
                if info.player not in newest or info.step >= newest[info.player].step:
                    newest[info.player] = info
        weights: dict[str, float] = {}
        for dist in self.distributions.values():
            for opponent, p in dist.items():
                if opponent in created:
                    weights[opponent] = weights.get(opponent, 0.0) + p
        return created, [newest[p].id for p in self.learners if p in newest], weights

    # -- persistence -------------------------------------------------------------------------------
    def ratings_record(self, now: float) -> dict:
        """One line of ratings.jsonl: unix time `now`, games scored, every member's Elo (0.1 points)."""
        return {"time": now, "games": self.games, "elo": {m: round(r.elo, 1) for m, r in self.elo.ratings.items()}}

    def to_json(self) -> dict:
        """The league's part of state.json: version, env, members, payoff (pooled and per seat), Elo,
        latest snapshots and lineage, counts, distributions (computed now if none yet), dropped snapshots."""
        return {"version": STATE_VERSION, "env": self.env,
                "members": {m: info.to_json() for m, info in self.members.items()},
                "payoff": self.payoff.to_json(), "payoff_by_seat": self.payoff.seats_to_json(),
                "elo": self.elo.to_json(), "last_snapshot": self.last_snapshot, "lineage": self.lineage,
                "games": self.games, "skipped_results": self.skipped,
                "distributions": self.distributions or {p: self.distribution(p) for p in self.learners},
                "dropped": self.dropped, "evicted_games": self.evicted_games}

    def restore(self, state: dict) -> None:
        """Take back what `to_json` wrote: snapshots, payoff, Elo, latest snapshots, lineage and counts.
        Learners and bots come from the config: a bot no longer in `league.bots` leaves, with its results.

        Raises ValueError (nothing changed) when `state` is of another version or env, or malformed:
        a malformed member, negative or non-finite payoff counts or ratings, missing keys."""
        try:
            if state.get("version") != STATE_VERSION or state.get("env") != self.env:
                raise ValueError(f"it is version {state.get('version')} of env {state.get('env')!r}")
            members = [Member.from_json(str(k), v) for k, v in state["members"].items()]
            payoff = PayoffTable.from_json(state["payoff"], self.payoff.decay, self.payoff.min_games,
                                           state.get("payoff_by_seat", []))
            elo = EloRatings.from_json(state["elo"], self.elo.k)
            _check_numbers(state)
            last = {p: int(state.get("last_snapshot", {}).get(p, 0)) for p in self.learners}
            lineage = {p: state.get("lineage", {}).get(p) for p in self.learners}
            games, evicted_games = int(state.get("games", 0)), int(state.get("evicted_games", 0))
            dropped = {str(k): str(v) for k, v in dict(state.get("dropped", {})).items()}
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{type(e).__name__}: {e}") from None
        self.members.update({m.id: m for m in members if m.kind == "snapshot"})
        self.payoff, self.elo = payoff, elo
        for member in members:
            if member.kind == "bot" and member.id not in self.cfg.bots:
                self.payoff.remove(member.id)
                self.elo.ratings.pop(member.id, None)
        self.last_snapshot, self.lineage, self.games, self.evicted_games = last, lineage, games, evicted_games
        self.dropped = dropped


def _check_numbers(state: dict) -> None:
    """Raise ValueError when state.json's payoff counts are negative or any count or rating is not finite."""
    counts = [x for row in state["payoff"] for x in row[2:]] + [
        x for row in state.get("payoff_by_seat", []) for x in row[3:]]
    numbers = counts + [x for v in state["elo"].values() for x in v]
    if not all(math.isfinite(x) for x in numbers) or any(x < 0 for x in counts):
        raise ValueError("its payoff or ratings hold negative or non-finite numbers")
