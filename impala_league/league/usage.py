"""What a long league run takes: the run directory's bytes, Redis's memory and append-only file, and the
retention rule of the league's one file that grows with players (ratings.jsonl).

What grows in a run directory, and its rule:
  league/snapshots/    one file per snapshot, kept for the run's life (every snapshot stays a member);
  league/ratings.jsonl a line of every member's Elo every 10 s: thinned by `thin_jsonl` (every other
                       line dropped, the first and the last kept) once past RATINGS_MAX_BYTES;
  league/state.json    rewritten at every pass: its size follows the payoff table (pairs that played);
  checkpoints/         `latest.safetensors` per learner, rewritten in place; without a league, evenly
                       spaced copies in `checkpoints/history/` (at most 16: distributed/learner/checkpoint_history.py);
  metrics*.jsonl       one record per learner per `run.log_every_s`: grows linearly, a few MB a day;
  redis/               the embedded Redis's append-only file, rewritten by Redis itself once it has
                       grown by `auto-aof-rewrite-percentage` (distributed/launch/embedded_redis.py sets it).
`Usage.check` logs a warning with the numbers when the run directory or Redis passes its budget
(`league.disk_budget_mb`, `league.redis_budget_mb`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import redis

log = logging.getLogger("league")

RATINGS_MAX_BYTES = 32 * 2**20
"""ratings.jsonl is thinned (`thin_jsonl`) once it is this large."""
CHECK_EVERY_S = 30.0
"""Seconds between two measurements of the run directory and Redis (`Usage.due`)."""
WARN_EVERY_S = 600.0
"""A budget passed is warned about at most this often."""
MB = 2**20


def tree_bytes(path: Path) -> int:
    """Bytes of the regular files under `path` (links not followed; files vanishing meanwhile skipped)."""
    total = 0
    stack = [str(path)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
            except OSError:
                continue
    return total


def redis_memory(client: redis.Redis) -> dict[str, int | None]:
    """Redis's `used_memory`, and its append-only file's size (`aof_current_size`, None without one);
    both None where the server refuses INFO (a managed Redis may)."""
    try:
        memory = client.info("memory")
        persistence = client.info("persistence")
    except redis.ResponseError:
        return {"used_memory": None, "aof_bytes": None}
    aof = persistence.get("aof_current_size") if persistence.get("aof_enabled") else None
    return {"used_memory": int(memory["used_memory"]), "aof_bytes": None if aof is None else int(aof)}


def thin_jsonl(path: Path, max_bytes: int) -> bool:
    """Once `path` holds more than `max_bytes`, rewrite it (atomically) with every other line: the first
    and the last lines stay, so a curve over the whole run keeps its ends and its shape at half the
    points. Returns whether it thinned. A line that is cut (a crash while appending) is dropped."""
    try:
        if path.stat().st_size <= max_bytes:
            return False
        lines = path.read_bytes().splitlines(keepends=True)
    except FileNotFoundError:
        return False
    lines = [line for line in lines if line.endswith(b"\n")]
    kept = lines[:-1:2] + lines[-1:] if len(lines) > 2 else lines
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_bytes(b"".join(kept))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return True


@dataclass
class Usage:
    """Measures the run directory and Redis every CHECK_EVERY_S, warns past the budgets.

    run_dir: the run's directory; disk_budget_mb, redis_budget_mb: the budgets (league config).
    `last` holds the latest measurement (saved in the league state): run_dir_bytes, used_memory,
    aof_bytes (None without an append-only file), time.
    """

    run_dir: Path
    disk_budget_mb: float
    redis_budget_mb: float
    last_check: float = float("-inf")
    last_warning: float = float("-inf")

    def __post_init__(self) -> None:
        self.last: dict = {}

    def due(self, now: float) -> bool:
        """Is a new measurement due at monotonic time `now`?"""
        return now - self.last_check >= CHECK_EVERY_S

    def check(self, client: redis.Redis, now: float, wall: float) -> dict:
        """Measure (monotonic `now`, unix `wall`), warn with the numbers when a budget is passed; returns
        the measurement."""
        self.last_check = now
        self.last = {"time": wall, "run_dir_bytes": tree_bytes(self.run_dir), **redis_memory(client)}
        over = []
        if self.last["run_dir_bytes"] > self.disk_budget_mb * MB:
            over.append(f"the run directory {self.run_dir} holds {self.last['run_dir_bytes'] / MB:.0f} MB "
                        f"(league.disk_budget_mb={self.disk_budget_mb:g})")
        if self.last["used_memory"] is not None and self.last["used_memory"] > self.redis_budget_mb * MB:
            aof = self.last["aof_bytes"]
            over.append(f"Redis uses {self.last['used_memory'] / MB:.0f} MB of memory"
                        + (f" and an append-only file of {aof / MB:.0f} MB" if aof is not None else "")
                        + f" (league.redis_budget_mb={self.redis_budget_mb:g})")
        if over and now - self.last_warning >= WARN_EVERY_S:
            self.last_warning = now
            log.warning("over budget: %s", "; ".join(over))
        return self.last
