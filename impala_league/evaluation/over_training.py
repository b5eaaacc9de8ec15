"""How a run's greedy policy played over training: some of its earlier policies against baseline bots.

The earlier policies are checkpoint files whose meta holds the update `step` and `agent_steps_trained`: with a
league the main agent's snapshots (`league/snapshots/main-*.safetensors`), without one the copies of
its checkpoint that `run.py train` keeps (`checkpoints/history/`, distributed/learner/checkpoint_history.py).
`earlier_policies` picks a few, evenly spaced; `evaluate_over_training` plays each in every seat
against each bot, and against a judge the run never trained against (the held-out score), as the final
evaluation does but with fewer games. `run.py train` keeps the result
under `over_training` in evaluation.json and `run.py report` plots it against agent steps trained.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from impala_league.agents.checkpoint import CheckpointError, read_meta
from impala_league.agents.policy import load_policy
from impala_league.evaluation.evaluate import evaluate
from impala_league.evaluation.positions import evaluate_positions

log = logging.getLogger("evaluation")


def earlier_policies(paths: Iterable[Path], before_step: int | None, count: int) -> list[tuple[Path, dict]]:
    """Up to `count` of the checkpoints `paths` whose update step is below `before_step` (None: any),
    with their meta, oldest first: evenly spaced in their order of steps, the newest always among them.

    A file whose meta cannot be read, or has no integer step, is skipped with a warning.
    """
    found = []
    for path in paths:
        try:
            meta = read_meta(path)
        except CheckpointError as e:
            log.warning("over training: skipping %s: %s", path, e)
            continue
        step = meta.get("step")
        if not isinstance(step, int):
            log.warning("over training: skipping %s: its meta has no update step", path)
        elif before_step is None or step < before_step:
            found.append((Path(path), meta))
    found.sort(key=lambda item: item[1]["step"])
    if count <= 0 or len(found) <= count:
        return found if count > 0 else []
    # From the newest back to the oldest: with count = 1 the newest alone.
    picks = np.linspace(len(found) - 1, 0, count).round().astype(int)
    return [found[i] for i in sorted(set(picks.tolist()))]


def evaluate_over_training(policies: Sequence[tuple[Path, dict]], opponents: Sequence[str], games: int,
                           seed: int = 0, judges: Sequence[str] = (), positions: int = 0) -> list[dict]:
    """Each policy of `policies` (path, meta), greedy, against each bot of `opponents` and each judge of
    `judges` (evaluation/judges.py) in every seat, and with `positions` > 0 its moves in that many solved
    positions (evaluation/positions.py; seed 0, the final policy's set).

    Returns one JSON-ready dict per policy, in order: `checkpoint` (path), `step`, `agent_steps_trained`
    (agent steps trained on; None where the meta lacks them), `games` (per seat and opponent) and `opponents`:
    {opponent: {seat name: `MatchResult.as_dict()`}}, the shape of evaluation.json's `opponents`, and with
    `judges` also `judges` of the same shape, with `positions` also `positions` (`evaluate_positions`'s). Every
    policy plays the same games (`seed`), so differences come from the policies alone. A policy whose
    file is missing, corrupt or not a policy of this project is left out with a warning: the final
    evaluation is kept without it.
    """
    out = []
    for path, meta in policies:
        try:
            policy = load_policy(path)
        except CheckpointError as e:
            log.warning("over training: leaving out %s: %s", path, e)
            continue
        entry = {"checkpoint": str(path), "step": meta.get("step"),
                 "agent_steps_trained": meta.get("agent_steps_trained"), "games": games,
                 "opponents": {opponent: evaluate(policy, opponent, games, seed)["seats"] for opponent in opponents}}
        if judges:
            entry["judges"] = {judge: evaluate(policy, judge, games, seed)["seats"] for judge in judges}
        if positions:
            entry["positions"] = evaluate_positions(policy, policy.spec.name, positions)
        out.append(entry)
    return out
