"""Elo ratings from game results: a maximum-likelihood Bradley-Terry fit with standard errors.

Model (Bradley & Terry 1952; Elo's logistic form): player i scores against player j with probability

    p_ij = 1 / (1 + 10 ** ((r_j - r_i) / 400)),

ratings ``r`` on the usual 400 * log10 scale (a 75% expected score is 400 * log10(3) = 190.8 points).
A draw counts as half a win and half a loss. ``fit_elo`` maximises the log-likelihood

    L(r) = sum_{i<j} s_ij log p_ij + (n_ij - s_ij) log(1 - p_ij)

over all games (``s_ij``: points of i against j, ``n_ij``: games between them). Ratings are only
defined up to a common shift; they are anchored so that their **mean is 0**.

Light regularisation: ``prior_draws`` virtual drawn games are added to every pair that met, so a
player that won every game still gets a finite rating (with one virtual draw, 40 wins out of 40
rate 400 * log10(81) = 763 points above the opponent instead of infinitely many).

Standard errors come from the inverse of the observed Fisher information, the Hessian of -L at
the maximum (for this model it equals the expected information): with ``H`` singular along the
common shift, the covariance of the mean-anchored ratings is its Moore-Penrose pseudo-inverse.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ELO_PER_NAT = 400 / np.log(10)
"""Elo points per unit of the natural-log rating (the logistic's argument): 173.7."""


@dataclass(frozen=True)
class EloFit:
    """ratings / stderr: float64 [N] Elo points (mean 0); covariance: float64 [N, N] Elo points²."""

    ratings: np.ndarray
    stderr: np.ndarray
    covariance: np.ndarray
    iterations: int


def _log_likelihood(theta: np.ndarray, points: np.ndarray, games: np.ndarray) -> float:
    diff = theta[:, None] - theta[None, :]
    # log p_ij = -log(1 + exp(-(theta_i - theta_j))), computed without overflow.
    log_p = -np.logaddexp(0.0, -diff)
    return float(np.sum(points * log_p))  # sums every ordered pair: i's points and j's points


def _information(theta: np.ndarray, games: np.ndarray) -> np.ndarray:
    """Hessian of -L in natural units: sum_ij n_ij p_ij (1 - p_ij) (e_i - e_j)(e_i - e_j)^T."""
    diff = theta[:, None] - theta[None, :]
    p = 1.0 / (1.0 + np.exp(-diff))
    w = games * p * (1.0 - p)
    return np.diag(w.sum(axis=1)) - w


def _connected(games: np.ndarray) -> bool:
    seen, frontier = {0}, [0]
    while frontier:
        i = frontier.pop()
        for j in np.flatnonzero(games[i] > 0):
            if int(j) not in seen:
                seen.add(int(j))
                frontier.append(int(j))
    return len(seen) == len(games)


def fit_elo(points: np.ndarray, games: np.ndarray, prior_draws: float = 1.0, tol: float = 1e-10,
            max_iterations: int = 200) -> EloFit:
    """Maximum-likelihood Elo ratings of N players from their head-to-head results.

    Args:
      points: float [N, N]; ``points[i, j]`` = wins + draws / 2 of player i against player j.
      games: float [N, N], symmetric; games played between i and j (``points + points.T == games``).
      prior_draws: virtual draws added to every pair with ``games > 0`` (0 = the plain MLE, which
        is infinite for a player that won or lost every game).
      tol: stop when the largest Newton step is below this many natural-log units.
      max_iterations: Newton iterations at most.

    Returns:
      An ``EloFit``: ratings with mean 0, their standard errors and covariance.

    Raises:
      ValueError: shapes or values inconsistent, fewer than 2 players, players not all connected
        by games (their relative ratings would be undefined), or no finite maximum (only possible
        with ``prior_draws == 0``).
    """
    points = np.asarray(points, dtype=np.float64)
    games = np.asarray(games, dtype=np.float64)
    n = len(points)
    if points.shape != (n, n) or games.shape != (n, n) or n < 2:
        raise ValueError(f"points and games must both be [N, N] with N >= 2; got {points.shape}, {games.shape}")
    if (points < 0).any() or not np.allclose(games, games.T) or not np.allclose(points + points.T, games):
        raise ValueError("need points >= 0, games symmetric and points[i, j] + points[j, i] == games[i, j]")
    if not _connected(games):
        raise ValueError("players are not all connected by games; their relative ratings are undefined")
    met = (games > 0) & ~np.eye(n, dtype=bool)
    points = points + met * (prior_draws / 2)
    games = games + met * prior_draws
    theta = np.zeros(n)
    objective = _log_likelihood(theta, points, games)
    for iteration in range(1, max_iterations + 1):
        p = 1.0 / (1.0 + np.exp(-(theta[:, None] - theta[None, :])))
        gradient = (points - games * p).sum(axis=1)
        step = np.linalg.pinv(_information(theta, games)) @ gradient
        # Newton on a concave objective; halving guards the first steps from far-off starts.
        scale = 1.0
        while scale > 1e-6:
            candidate = theta + scale * step
            new_objective = _log_likelihood(candidate, points, games)
            if new_objective >= objective - 1e-12:
                break
            scale /= 2
        theta, objective = candidate - candidate.mean(), new_objective
        if np.abs(scale * step).max() < tol:
            break
    else:
        raise ValueError(f"the Elo fit did not converge in {max_iterations} iterations; "
                         "with prior_draws=0 a player that won or lost every game has no finite rating")
    covariance = np.linalg.pinv(_information(theta, games)) * ELO_PER_NAT**2
    return EloFit(theta * ELO_PER_NAT, np.sqrt(np.clip(np.diag(covariance), 0, None)), covariance, iteration)
