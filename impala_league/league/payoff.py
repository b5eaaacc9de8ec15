"""Who beats whom: decayed win/draw/loss counts between players, and Elo ratings with uncertainty.

Players are string ids: learners (`main`, `main_exploiter_0`, ...), snapshots (`main-000400`) and
baseline bots (`random`, `tactical`, `minimax:2`). Every count is kept for both orders of a pair.

Decay follows AlphaStar's payoff (Vinyals et al. 2019, pseudocode `Payoff.update`): before a result
between `a` and `b` is added, that pair's counts are multiplied by `decay`, so a learner's win rate
tracks its recent weights rather than its whole history. Draws count as half a win.

Per seat: in games with a first-move advantage a pooled win rate hides a weak seat, so the table
also keeps the player's counts per seat it held (decayed the same way), and `win_rate(..., seat=
"weaker")` is the lower of its per-seat win rates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

ELO_SCALE = 400.0 / math.log(10.0)  # rating points per unit of logit


@dataclass
class Record:
    """Decayed counts of one player's games against one opponent (floats: decay makes them fractional)."""

    wins: float = 0.0
    draws: float = 0.0
    losses: float = 0.0

    @property
    def games(self) -> float:
        return self.wins + self.draws + self.losses

    def scale(self, factor: float) -> None:
        self.wins *= factor
        self.draws *= factor
        self.losses *= factor


@dataclass
class PayoffTable:
    """Decayed results between every pair of players.

    Args:
      decay: factor in (0, 1] applied to a pair's counts before each new result of that pair
        (1 = plain counts).
      min_games: a win rate counts only once the pair's decayed game count reaches this.
    """

    decay: float = 0.99
    min_games: float = 10.0
    records: dict[tuple[str, str], Record] = field(default_factory=dict)
    seat_records: dict[tuple[str, str, int], Record] = field(default_factory=dict)  # (player, opponent, its seat)
    seats: set[int] = field(default_factory=set)  # every seat in seat_records: "weaker" looks up each, not all records

    def add(self, player: str, opponent: str, score: float, seat: int | None = None) -> None:
        """Record one game; `score` is the player's result: 1 = win, 0.5 = draw, 0 = loss; `seat`
        the seat the player held (None: not known, pooled counts only).

        Raises ValueError for a score outside {0, 0.5, 1} or a game of a player against itself.
        """
        if score not in (0.0, 0.5, 1.0):
            raise ValueError(f"score must be 0, 0.5 or 1, got {score!r}")
        if player == opponent:
            raise ValueError(f"a player cannot be scored against itself ({player!r})")
        mine = self.records.setdefault((player, opponent), Record())
        theirs = self.records.setdefault((opponent, player), Record())
        _count(mine, score, self.decay)
        _count(theirs, 1.0 - score, self.decay)
        if seat is not None:
            _count(self.seat_records.setdefault((player, opponent, int(seat)), Record()), score, self.decay)
            self.seats.add(int(seat))

    def games(self, player: str, opponent: str) -> float:
        record = self.records.get((player, opponent))
        return record.games if record else 0.0

    def _rate(self, record: Record | None) -> float | None:
        if record is None or record.games < self.min_games or record.games == 0:
            return None
        return (record.wins + 0.5 * record.draws) / record.games

    def win_rate(self, player: str, opponent: str, seat: str | int = "pooled") -> float | None:
        """(wins + draws / 2) / games of `player` against `opponent`; None below `min_games` games.

        seat: "pooled" (all games), a seat index (games in which the player held it), or "weaker":
        the lowest per-seat win rate among seats with `min_games` games, the pooled rate while no
        seat has that many.
        """
        if seat == "pooled":
            return self._rate(self.records.get((player, opponent)))
        if seat == "weaker":
            rates = [r for s in self.seats if (r := self._rate(self.seat_records.get((player, opponent, s)))) is not None]
            return min(rates) if rates else self.win_rate(player, opponent)
        return self._rate(self.seat_records.get((player, opponent, int(seat))))

    def remove(self, player: str) -> None:
        """Forget every record involving `player` (an exploiter whose weights were reset)."""
        self.records = {pair: r for pair, r in self.records.items() if player not in pair}
        self.seat_records = {key: r for key, r in self.seat_records.items() if player not in key[:2]}

    def to_json(self) -> list[list]:
        return [[a, b, r.wins, r.draws, r.losses] for (a, b), r in sorted(self.records.items())]

    def seats_to_json(self) -> list[list]:
        return [[a, b, s, r.wins, r.draws, r.losses] for (a, b, s), r in sorted(self.seat_records.items())]

    @classmethod
    def from_json(cls, rows: list[list], decay: float, min_games: float, seat_rows: list[list] = ()) -> "PayoffTable":
        table = cls(decay=decay, min_games=min_games)
        for a, b, w, d, l in rows:
            table.records[(str(a), str(b))] = Record(float(w), float(d), float(l))
        for a, b, s, w, d, l in seat_rows:
            table.seat_records[(str(a), str(b), int(s))] = Record(float(w), float(d), float(l))
            table.seats.add(int(s))
        return table


def _count(record: Record, score: float, decay: float) -> None:
    """Decay `record`, then add one game with `score` (1 win, 0.5 draw, 0 loss)."""
    record.scale(decay)
    if score == 1.0:
        record.wins += 1
    elif score == 0.0:
        record.losses += 1
    else:
        record.draws += 1


def episode_score(result: dict) -> float:
    """The learner's score in one reported episode: 1 win, 0.5 draw, 0 loss.

    result: an episode result as actors report it, with `winner` (seat, -1 = draw) and
    `learner_seat` (the seat the learning player held).
    """
    winner = result.get("winner", -1)
    if winner == -1:
        return 0.5
    return 1.0 if winner == result.get("learner_seat", -1) else 0.0


def expected_score(rating: float, opponent_rating: float) -> float:
    """Elo's expected score of a player rated `rating` against `opponent_rating` (both in Elo points)."""
    return 1.0 / (1.0 + 10.0 ** ((opponent_rating - rating) / 400.0))


@dataclass
class Rating:
    """An Elo rating and the Fisher information gathered about it (sum of p(1-p) over its games)."""

    elo: float = 0.0
    information: float = 0.0

    @property
    def uncertainty(self) -> float:
        """Approximate standard error in Elo points: ELO_SCALE / sqrt(information + 1).

        The +1 is a weak prior (one game's worth at p = 1/2 counts 1/4) so a new player's
        uncertainty is finite (about 174 points) and shrinks like 1/sqrt(games).
        """
        return ELO_SCALE / math.sqrt(self.information + 1.0)


@dataclass
class EloRatings:
    """Online Elo (Elo 1978): after a game, R_a += K (S_a - E_a) and R_b -= K (S_a - E_a).

    Args:
      k: the K-factor in Elo points per game.
    """

    k: float = 8.0
    ratings: dict[str, Rating] = field(default_factory=dict)

    def get(self, player: str) -> Rating:
        return self.ratings.setdefault(player, Rating())

    def update(self, player: str, opponent: str, score: float) -> None:
        """Apply one game with `player`'s score (1, 0.5 or 0)."""
        a, b = self.get(player), self.get(opponent)
        expected = expected_score(a.elo, b.elo)
        delta = self.k * (score - expected)
        a.elo += delta
        b.elo -= delta
        a.information += expected * (1 - expected)
        b.information += expected * (1 - expected)

    def copy_to(self, source: str, target: str) -> None:
        """A new player (a snapshot) starts with the rating and information of the learner it froze."""
        r = self.get(source)
        self.ratings[target] = Rating(r.elo, r.information)

    def to_json(self) -> dict[str, list[float]]:
        return {p: [r.elo, r.information] for p, r in sorted(self.ratings.items())}

    @classmethod
    def from_json(cls, data: dict[str, list[float]], k: float) -> "EloRatings":
        return cls(k=k, ratings={str(p): Rating(float(e), float(i)) for p, (e, i) in data.items()})
