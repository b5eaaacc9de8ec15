"""The live terminal view of `run.py train`: a progress bar to the run's real end (`run.total_agent_steps`
or `run.max_minutes` of training, whichever comes first) with an estimate of the time left, and below
it SPS, policy lag, queue depth and the latest score, read from the learner's metrics.jsonl as it grows;
then, while the final policy is evaluated, a line that says so.

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

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from impala_league.config import Config
from impala_league.records import upgraded


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


def clock(seconds: float) -> str:
    """'1:05:09' or '4:07': hours, minutes and seconds as the bar's elapsed time shows them."""
    minutes, secs = divmod(max(0, round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def progress_to_end(record: dict, total_steps: int, max_minutes: float) -> tuple[float, str]:
    """(fraction of the run done, 'ends in ~M:SS (time limit)') for a metrics `record` (`agent_steps_trained`,
    `elapsed_s`: training seconds, `sps`). The run ends at `total_steps` agent steps or
    `max_minutes` of training (0 = none), whichever comes first; the estimate assumes the current SPS."""
    agent_steps, elapsed = record.get("agent_steps_trained", 0), record.get("elapsed_s", 0.0)
    fraction, left, why = agent_steps / total_steps, None, "agent steps"
    if record.get("sps"):
        left = max(0.0, (total_steps - agent_steps) / record["sps"])
    if max_minutes > 0:
        fraction = max(fraction, elapsed / (60 * max_minutes))
        time_left = max(0.0, 60 * max_minutes - elapsed)
        if left is None or time_left < left:
            left, why = time_left, "time limit"
    eta = f"ends in ~{clock(left)} ({why})" if left is not None else ""
    return min(1.0, fraction), eta


class LiveView:
    """Context manager: shows the bar while the run lasts; `refresh` re-reads new metrics records,
    `evaluating` says what the run does after training."""

    def __init__(self, cfg: Config, metrics_file: Path, console: Console | None = None):
        self.metrics_file = Path(metrics_file)
        self.offset = 0
        self.total_steps, self.max_minutes = cfg.run.total_agent_steps, cfg.run.max_minutes
        self.console = console or Console()
        self.limit = limit = f" or {cfg.run.max_minutes:g} min" if cfg.run.max_minutes > 0 else ""
        self.progress = Progress(TextColumn("[bold]{task.fields[run]}"), BarColumn(), TextColumn("{task.fields[steps]}"),
                                 TimeElapsedColumn(), TextColumn("{task.fields[eta]}"), console=self.console)
        self.task = self.progress.add_task("train", total=1.0, run=cfg.run.name, eta="",
                                           steps=f"0 / {self.total_steps:,} agent steps{limit}")
        self.status = Text("waiting for the first metrics")
        self.live = Live(Group(self.progress, self.status), console=self.console, refresh_per_second=2,
                         transient=False)
        self.lock = threading.Lock()

    def refresh(self) -> dict | None:
        """Advance the bar to the newest record; returns that record (None if none is new)."""
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
                latest = upgraded(json.loads(line))  # a resumed run's file may begin with older records
            except json.JSONDecodeError:
                continue
        if latest is not None:
            fraction, eta = progress_to_end(latest, self.total_steps, self.max_minutes)
            steps = f"{latest.get('agent_steps_trained', 0):,} / {self.total_steps:,} agent steps{self.limit}"
            self.progress.update(self.task, completed=fraction, eta=eta, steps=steps)
            self.status.plain = describe(latest)
        return latest

    def evaluating(self, what: str) -> None:
        """Training is over: the bar full, and the line below it `what` the run now does."""
        self.refresh()
        self.progress.update(self.task, completed=1.0, eta="trained")
        self.status.plain = what

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
