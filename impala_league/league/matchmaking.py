"""Opponent distributions: prioritized fictitious self-play (PFSP) and the AlphaStar roles.

Source: Vinyals et al. 2019, "Grandmaster level in StarCraft II using multi-agent reinforcement
learning", Methods (PFSP) and the pseudocode (`MainPlayer`, `MainExploiter`, `LeagueExploiter`).

PFSP picks opponent B for learner A with probability f(P[A beats B]) / sum_C f(P[A beats C]):
  hard      f(x) = (1 - x)^p   focus on the opponents A loses to (p = 2 in AlphaStar)
  variance  f(x) = x (1 - x)   focus on opponents of about A's level
  uniform   f(x) = 1
An opponent with too few games to count has x = 1/2. With `seat="weaker"` x is the learner's lower
per-seat win rate (league/payoff.py), so a seat it loses with keeps pulling its opponents in.

A distribution is a dict {opponent id: probability}; the id `self` means the learner's own latest
weights (plain self-play), a learner id (`main`) that learner's latest weights.
"""

from __future__ import annotations

import numpy as np

from impala_league.config import PFSP_WEIGHTINGS, LeagueConfig
from impala_league.league.payoff import PayoffTable
from impala_league.league.players import MAIN

SELF = "self"


def pfsp_probabilities(win_rates: list[float | None], weighting: str = "hard", p: float = 2.0) -> np.ndarray:
    """PFSP probabilities [N] (float64, sum 1) for the learner's win rates against N candidates.

    A None win rate (too few games) counts as 1/2. When every weight is 0 (the learner beats or
    loses to everyone surely, depending on the weighting) the candidates are drawn uniformly.

    Raises ValueError for an unknown weighting or no candidates.
    """
    if weighting not in PFSP_WEIGHTINGS:
        raise ValueError(f"unknown PFSP weighting {weighting!r}; valid: {', '.join(PFSP_WEIGHTINGS)}")
    if not win_rates:
        raise ValueError("PFSP needs at least one candidate opponent")
    x = np.array([0.5 if w is None else w for w in win_rates], dtype=np.float64)
    if weighting == "hard":
        weights = (1.0 - x) ** p
    elif weighting == "variance":
        weights = x * (1.0 - x)
    else:
        weights = np.ones_like(x)
    total = weights.sum()
    if total <= 0:
        return np.full(len(x), 1.0 / len(x))
    return weights / total


def _mix(parts: list[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """sum_k share_k * dist_k, shares of empty distributions given to the first non-empty part."""
    spare = sum(share for share, dist in parts if not dist)
    live = [(share, dist) for share, dist in parts if dist]
    out: dict[str, float] = {}
    for k, (share, dist) in enumerate(live):
        share += spare if k == 0 else 0.0
        for opponent, prob in dist.items():
            out[opponent] = out.get(opponent, 0.0) + share * prob
    total = sum(out.values())
    return {o: p / total for o, p in out.items() if p > 0}


def _pfsp(player: str, candidates: list[str], payoff: PayoffTable, weighting: str, p: float,
          seat: str = "pooled") -> dict[str, float]:
    if not candidates:
        return {}
    probs = pfsp_probabilities([payoff.win_rate(player, c, seat) for c in candidates], weighting, p)
    return dict(zip(candidates, probs.tolist()))


def main_agent_opponents(player: str, payoff: PayoffTable, league: list[str], own_snapshots: list[str],
                         cfg: LeagueConfig, bots: list[str] = ()) -> dict[str, float]:
    """The main agent's mix: self-play, PFSP over the whole league, its forgotten snapshots, and
    (beyond AlphaStar) a fixed share of PFSP over the baseline bots.

    league: every frozen player (snapshots of all roles, baseline bots); own_snapshots: this
    player's snapshots; bots: the baseline bots among them. A snapshot is *forgotten* when the
    player's win rate against it is known and below `forgotten_below`; those get `forgotten` of the
    mass, by hard PFSP. The bots get `bot_share` of the mass whatever PFSP over the league gives them,
    which keeps the positions a weak or erratic player reaches in training once the agent beats
    them often. A part with no candidates passes its share on (self-play first), so a league
    without snapshots or bots is self-play.
    """
    forgotten = [s for s in own_snapshots
                 if (w := payoff.win_rate(player, s)) is not None and w < cfg.forgotten_below]
    return _mix([(cfg.self_play, {SELF: 1.0}),
                 (cfg.pfsp, _pfsp(player, league, payoff, cfg.pfsp_weighting, cfg.pfsp_p, cfg.pfsp_seat)),
                 (cfg.forgotten, _pfsp(player, forgotten, payoff, "hard", cfg.pfsp_p, cfg.pfsp_seat)),
                 (cfg.bot_share, _pfsp(player, list(bots), payoff, cfg.pfsp_weighting, cfg.pfsp_p, cfg.pfsp_seat))])


def main_exploiter_opponents(player: str, payoff: PayoffTable, main_snapshots: list[str],
                             cfg: LeagueConfig) -> dict[str, float]:
    """The main exploiter plays the main agent's latest weights, unless it cannot win at all yet
    (win rate below `exploiter_gives_up_below`): then variance-PFSP over the main agent's
    snapshots, which gives it opponents it can learn from (AlphaStar's MainExploiter)."""
    w = payoff.win_rate(player, MAIN)
    if w is not None and w < cfg.exploiter_gives_up_below and main_snapshots:
        return _pfsp(player, main_snapshots, payoff, "variance", cfg.pfsp_p, cfg.pfsp_seat)
    return {MAIN: 1.0}


def league_exploiter_opponents(player: str, payoff: PayoffTable, league: list[str],
                               cfg: LeagueConfig) -> dict[str, float]:
    """The league exploiter: hard PFSP over the whole league (the main agent's latest weights while
    the league holds nobody else), finding strategies no player in it can answer."""
    return _pfsp(player, league, payoff, cfg.pfsp_weighting, cfg.pfsp_p, cfg.pfsp_seat) or {MAIN: 1.0}
