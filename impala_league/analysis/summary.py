"""The few lines `run.py train` ends a finished run with: what it trained, its evaluation's headline,
where its files are, and the next command. Read from the run directory (checkpoints/latest.json,
evaluation.json), so they say what was saved, not what a process remembers."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from impala_league.analysis.runs import EVALUATION_FILE
from impala_league.records import upgraded
from impala_league.tracking import offline_segments

CHECKPOINT_META = Path("checkpoints") / "latest.json"


def pooled_score(seats: dict) -> float:
    """Score (win + draw/2) over every seat's games together: the games-weighted mean of the seats'
    `score`s. `seats`: seat name -> evaluate()'s result for that seat (with `score` and `games`)."""
    games = sum(r["games"] for r in seats.values())
    return sum(r["score"] * r["games"] for r in seats.values()) / games if games else float("nan")


def duration(seconds: float) -> str:
    """'42 s', '13.5 min' or '2.1 h': the one format of a run's length in these lines."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def evaluation_headline(record: dict) -> str | None:
    """One line of evaluation.json's numbers: the pooled score against each bot, then apart from them the
    judges' (held out: never trained against), the solver's positions' blunder rate and the built-in player's
    mean return; one-agent games their mean return. None when the record has none of these."""
    parts = []
    if "episodes" in record:
        e = record["episodes"]
        protocol = f" ({record['protocol']['name']} protocol)" if record.get("protocol") else ""
        sampled = f", sampled {record['episodes_sampled']['mean_return']:+.1f}" if record.get("episodes_sampled") else ""
        parts.append(f"mean return {e['mean_return']:+.1f} over {e.get('games', record.get('games', '?'))} "
                     f"episodes{protocol}{sampled}")
    bots = record.get("opponents") or {}
    if bots:
        parts.append("score vs " + ", ".join(f"{name} {pooled_score(seats):.2f}" for name, seats in bots.items()))
    held_out = [f"{name} {pooled_score(seats):.2f}" for name, seats in (record.get("judges") or {}).items()]
    if "positions" in record:
        held_out.append(f"solver's positions: blunder {100 * record['positions']['all']['blunder']:.1f}%")
    if held_out:
        parts.append("held out: " + ", ".join(held_out))
    built_in = record.get("built_in_player")
    if built_in:
        sampled = record.get("built_in_player_sampled")
        parts.append(f"held out: {built_in['env_id']}'s built-in player, mean return {built_in['mean_return']:+.1f} "
                     f"over {built_in['games']} games"
                     + (f" ({built_in['protocol']['name']} protocol)" if built_in.get("protocol") else "")
                     + (f", sampled {sampled['mean_return']:+.1f}" if sampled else ""))
    return "; ".join(parts) or None


def wandb_upload(run_dir: Path, name: str) -> str | None:
    """The command that uploads the run's offline wandb runs (every process that logged adds one, e.g. the
    learner and the final evaluation) as one run, oldest first; None without any."""
    if not offline_segments(run_dir, name):
        return None
    wandb = Path(sys.executable).with_name("wandb")
    pattern = shlex.quote(str(Path(run_dir) / "wandb")) + "/offline-run-*"  # the shell sorts them by time
    return f"{wandb if wandb.exists() else 'wandb'} sync --id {name} {pattern}"


def end_summary(run_dir: str | Path, name: str) -> list[str]:
    """The closing lines of a finished run in `run_dir` whose main learner is `name` (its wandb id):
    agent steps and training time, the evaluation's headline, the files, the wandb upload command (offline
    runs) and `run.py report`. Lines whose file is missing are left out."""
    run_dir = Path(run_dir)
    lines = []
    meta_path = run_dir / CHECKPOINT_META
    if meta_path.is_file():
        meta = upgraded(json.loads(meta_path.read_text()))
        lines.append(f"trained {meta.get('agent_steps_trained', 0):,} agent steps in "
                     f"{duration(meta.get('elapsed_s', 0.0))} "
                     f"({meta.get('step', 0):,} updates)")
    evaluation = run_dir / EVALUATION_FILE
    if evaluation.is_file():
        headline = evaluation_headline(upgraded(json.loads(evaluation.read_text())))
        if headline:
            lines.append(f"evaluation: {headline}")
    lines.append(f"files: {run_dir} (config.yaml, metrics.jsonl, checkpoints/, evaluation.json)")
    upload = wandb_upload(run_dir, name)
    if upload:
        lines.append(f"wandb (offline): {upload}")
    lines.append(f"next: .venv/bin/python run.py report {run_dir}  (a page of its curves and evaluation)")
    return lines
