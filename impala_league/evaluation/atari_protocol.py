"""How an Atari policy is evaluated: the protocol, written down once (docs/atari.md, "The evaluation protocol").

`run.py evaluate` of an `atari:<Game>` checkpoint, the end-of-run evaluation and the built-in-player judge
(evaluation/atari_judge.py) play their games under one of PROTOCOLS, whatever the policy trained with:

* `sticky` (the default): Machado et al.'s (2018, "Revisiting the Arcade Learning Environment") sticky
  actions, the emulator repeating the previous action with probability 0.25 at every frame, as ALE v5's
  own default and the peers' numbers (Sample Factory, CleanRL, RLlib on `ALE/<Game>-v5`); frame skip 4,
  up to 30 no-op starts, the minimal action set, games cut at 108,000 emulator frames (30 minutes of play);
* `deterministic`: the same without sticky actions, the protocol of the published IMPALA, A3C and DQN
  curves (Mnih et al. 2015; Espeholt et al. 2018). A greedy policy then plays a handful of distinct games
  over many seeds (docs/atari_judge.md), so its mean can hide a memorised sequence.

GAMES games a judgement, seeded `seed + k`. `protocol_kwargs` gives the env.kwargs a policy is played
with; `protocol_record` what evaluation.json keeps of it.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from impala_league.config import UserError

PROTOCOLS: dict[str, dict[str, Any]] = {
    "sticky": dict(sticky_actions=0.25, frame_skip=4, noop_max=30, max_episode_frames=108_000,
                   full_action_space=False),
    "deterministic": dict(sticky_actions=0.0, frame_skip=4, noop_max=30, max_episode_frames=108_000,
                          full_action_space=False),
}
DEFAULT = "sticky"
GAMES = 30
# Settings a policy's network is shaped by, or whose actions it chose among: the protocol cannot change them.
TRAINED_WITH = ("frame_skip", "full_action_space")


class ProtocolError(UserError, ValueError):
    """A protocol that does not exist, or that the policy's env cannot give (sticky actions in a board game)."""


def protocol_settings(name: str) -> dict[str, Any]:
    """The env settings of protocol `name` (a copy of PROTOCOLS[name]). Raises ProtocolError naming the valid ones."""
    if name not in PROTOCOLS:
        raise ProtocolError(f"unknown Atari evaluation protocol {name!r}; valid: {', '.join(PROTOCOLS)}")
    return dict(PROTOCOLS[name])


def protocol_kwargs(env_name: str, kwargs: Mapping[str, Any], name: str = DEFAULT) -> dict[str, Any]:
    """The env.kwargs an `atari:<Game>` policy trained with `kwargs` is evaluated with under protocol `name`:
    its own, with the protocol's sticky actions, no-op starts and time limit, played one gymnasium env a
    game (`emulator: gymnasium`, the reference path).

    Raises ProtocolError for an env that is not `atari:<Game>` (it has no sticky actions to set), or a
    policy trained with another frame skip or action set than the protocol's (`TRAINED_WITH`)."""
    if not env_name.startswith("atari:"):
        raise ProtocolError(f"{env_name} has no sticky actions or no-op starts: an Atari evaluation protocol "
                            f"(--protocol) is for atari:<Game> policies")
    from impala_league.envs import atari

    protocol = protocol_settings(name)
    trained = atari.settings(dict(kwargs))
    for key in TRAINED_WITH:
        if trained[key] != protocol[key]:
            raise ProtocolError(f"the policy was trained with env.kwargs.{key}={trained[key]!r}; the {name} "
                                f"protocol plays {key}={protocol[key]!r}")
    out = {**dict(kwargs), **protocol, "emulator": "gymnasium"}
    out.pop("emulator_threads", None)
    return out


def protocol_record(name: str, games: int) -> dict[str, Any]:
    """What evaluation.json keeps of the protocol a judgement was played under: its name, settings and games."""
    return {"name": name, **protocol_settings(name), "games": games}


def returns_summary(returns: list[float]) -> dict[str, Any]:
    """Mean of the per-game `returns` with the half-width of its 95% interval (Student t, n - 1 degrees of
    freedom; None for one game), and `distinct_returns`: how many different returns the games ended with
    (in Pong the return fixes the score line, 21:k or k:21, of a game played to its end)."""
    from impala_league.analysis.compare import mean_and_interval

    mean, half = mean_and_interval([float(r) for r in returns])
    scores = np.asarray(returns, dtype=float)
    return {"mean_return": mean, "interval": half, "std_return": float(scores.std()),
            "min_return": float(scores.min()), "max_return": float(scores.max()),
            "distinct_returns": len(set(scores.tolist()))}


def summary_text(result: Mapping[str, Any]) -> str:
    """'greedy: mean return +15.2 ± 1.3 (min +9, max +21, 12 distinct of 30 games)' for a dict of
    `returns_summary` with `greedy` and `games`."""
    half = "" if result.get("interval") is None else f" ± {result['interval']:.1f}"
    return (f"{'greedy' if result['greedy'] else 'sampled'}: mean return {result['mean_return']:+.1f}{half} "
            f"(min {result['min_return']:+.0f}, max {result['max_return']:+.0f}, {result['distinct_returns']} "
            f"distinct of {result['games']} games)")


def evaluate_atari(policy, games: int = GAMES, seed: int = 0, name: str = DEFAULT,
                   modes: tuple[bool, ...] = (True, False), record_dir=None, player: str = "checkpoint") -> dict[str, Any]:
    """An `atari:<Game>` policy (agents.policy.Policy) alone in its game under protocol `name`: `games` games
    seeded `seed + k`, played greedily and sampled (`modes`: greedy or not, in order); with `record_dir` the
    first mode's games are saved there as replays, the policy named `player`.

    Returns {"protocol": `protocol_record`, "greedy": ..., "sampled": ...}, each mode present being
    `evaluation.evaluate.episode_returns`'s dict with `returns_summary` and `games`. Raises ProtocolError as
    `protocol_kwargs` does."""
    from impala_league.evaluation.evaluate import episode_returns

    kwargs = protocol_kwargs(policy.spec.name, policy.config.env.kwargs, name)
    out: dict[str, Any] = {"protocol": protocol_record(name, games)}
    for i, greedy in enumerate(modes):
        r = episode_returns(policy, games, seed=seed, greedy=greedy, kwargs=kwargs,
                            record_dir=record_dir if i == 0 else None, name=player)
        out["greedy" if greedy else "sampled"] = {**r, **returns_summary(r["returns"]), "games": games}
    return out
