"""Reading what a training run left in its directory: config, metrics records, league files.

A run directory holds `config.yaml`, `metrics.jsonl` (one JSON record per `run.log_every_s`, written
by the learner: `time` in Unix seconds, `frames`, `sps`, `policy_lag`, losses, episode outcomes...),
and with a league `league/ratings.jsonl` and `league/state.json`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from config import Config, ConfigError
from experiment import from_yaml_text

# The learning-progress metric, in order of preference: score against league members and bots,
# then the return of the learning seat (the score of single-agent envs).
SCORE_KEYS = ("league_score", "episode_return")


@dataclass
class Run:
    """One run directory: `records` are the metrics lines in order; `start` (Unix s) is when the
    run began (the `started` file `run.py compare` writes, else config.yaml's modification time)."""

    path: Path
    config: Config
    records: list[dict]
    start: float

    @property
    def name(self) -> str:
        return self.path.name

    def elapsed(self, record: dict) -> float:
        """Seconds from the start of the run to `record`."""
        return float(record["time"]) - self.start


def load_run(path: str | Path) -> Run:
    """Read a run directory. Raises ConfigError (naming the file) if it is not one."""
    path = Path(path)
    config_file, metrics_file = path / "config.yaml", path / "metrics.jsonl"
    if not config_file.is_file():
        raise ConfigError(f"{path} is not a run directory: it has no config.yaml")
    config = from_yaml_text(config_file.read_text())
    records = []
    if metrics_file.is_file():
        for n, line in enumerate(metrics_file.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                raise ConfigError(f"{metrics_file}:{n} is not JSON") from None
    started = path / "started"
    start = float(started.read_text()) if started.is_file() else config_file.stat().st_mtime
    return Run(path, config, records, start)


def score_key(records: list[dict], wanted: str = "auto") -> str | None:
    """The metric that measures learning in `records`: `wanted`, or with "auto" the first of
    SCORE_KEYS that some record has. None if there is none."""
    keys = SCORE_KEYS if wanted == "auto" else (wanted,)
    return next((k for k in keys if any(k in r for r in records)), None)


def read_jsonl(path: Path) -> list[dict]:
    """Lines of a JSONL file that parse (a line being written when the run was stopped may not)."""
    out = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out
