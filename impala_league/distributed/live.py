"""The live terminal view of `run.py train`: a progress bar to `run.total_agent_steps` with SPS, policy lag,
queue depth and the latest score, read from the learner's metrics.jsonl as it grows.

Only on a terminal: the launcher then routes its children's output through `print_line`, so that
their log lines scroll above the bar instead of tearing it.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from pathlib import Path
from typing import IO

from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from impala_league.config import Config


def describe(record: dict) -> str:
    """The one-line summary of a metrics record shown beside the bar."""
    lag = record.get("policy_lag", 0)  # null when every unroll of the record came from before a rollback
    parts = [f"SPS {record.get('sps', 0):,.0f}", f"lag {lag:.1f}" if lag is not None else "lag -",
             f"queue {record.get('queue_depth', 0)}"]
    for key, label in (("league_score", "league score"), ("first_seat_win_rate", "first-seat wins")):
        if key in record:
            parts.append(f"{label} {record[key]:.2f}")
    if "episode_return" in record and "first_seat_win_rate" not in record:  # self-play returns sum to 0
        parts.append(f"return {record['episode_return']:.2f}")
    return "  ".join(parts)


class LiveView:
    """Context manager: shows the bar while the run lasts; `refresh` re-reads new metrics records."""

    def __init__(self, cfg: Config, metrics_file: Path, console: Console | None = None):
        self.metrics_file = Path(metrics_file)
        self.offset = 0
        self.console = console or Console()
        self.progress = Progress(TextColumn("[bold]{task.fields[run]}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.fields[status]}"), console=self.console)
        self.task = self.progress.add_task("train", total=cfg.run.total_agent_steps, run=cfg.run.name,
                                           status="waiting for the first metrics")
        self.live = Live(self.progress, console=self.console, refresh_per_second=2, transient=False)
        self.lock = threading.Lock()

    def refresh(self) -> dict | None:
        """Advance the bar to the newest record's frames; returns that record (None if none is new)."""
        if not self.metrics_file.is_file():
            return None
        with self.metrics_file.open() as f:
            f.seek(self.offset)
            chunk = f.read()
        complete = chunk[:chunk.rfind("\n") + 1]  # a line still being written waits for the next refresh
        self.offset += len(complete.encode())
        latest = None
        for line in complete.splitlines():
            try:
                latest = json.loads(line)
            except json.JSONDecodeError:
                continue
        if latest is not None:
            self.progress.update(self.task, completed=latest.get("frames", 0), status=describe(latest))
        return latest

    def print_line(self, line: str) -> None:
        """A child's output line, printed above the bar."""
        with self.lock:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def forward(self, stream: IO[bytes]) -> threading.Thread:
        """Print every line of `stream` (a child's stdout) above the bar, in a daemon thread."""
        def pump() -> None:
            for raw in iter(stream.readline, b""):
                self.print_line(raw.decode(errors="replace").rstrip("\n"))

        thread = threading.Thread(target=pump, name="live-output", daemon=True)
        thread.start()
        return thread

    def __enter__(self) -> "LiveView":
        self.live.__enter__()
        # Log handlers hold the real stdout; point them at Live's proxy so their lines scroll above the bar.
        self.handlers = [(h, h.setStream(sys.stdout)) for h in logging.getLogger().handlers
                         if isinstance(h, logging.StreamHandler) and h.stream is sys.__stdout__]
        return self

    def __exit__(self, *exc: object) -> None:
        self.refresh()
        for handler, stream in self.handlers:
            handler.setStream(stream)
        self.live.__exit__(None, None, None)
