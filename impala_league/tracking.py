"""Experiment tracking: the learner's metrics records and the report's figures, to wandb and TensorBoard.

`metrics.jsonl` in the run directory is the record of a run; this module copies it to the trackers a
config selects: wandb (`run.wandb_mode`: offline by default, online, disabled) and TensorBoard
(`run.tensorboard`: event files in `<run dir>/tensorboard/<name>`). Both get the same metrics: every
number of a record as a scalar at the learner's update step, and `policy_lag_counts` as a histogram.

wandb is quiet: its own console lines (a banner, a run summary of sparklines, and a Weave advertisement
it prints because our package is called `agents`, the name of an LLM library it looks for in
`sys.modules`) stay out of the run's output; `WANDB_SILENT=false` brings them back. It never captures
the console (`console="off"`): our log lines already go to our own output, and a captured terminal
copies wandb's ANSI colour codes into `files/output.log`.

A resumed run keeps its wandb id, so its offline segments upload as one run (`wandb sync --id`; wandb
writes one offline directory per process and cannot append to an earlier one), and its TensorBoard
events after the resumed checkpoint's step are purged, since that training was lost with the process
that logged it. This module imports nothing of the project but the config.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from impala_league.config import Config, without_secrets

if TYPE_CHECKING:
    from matplotlib.figure import Figure

log = logging.getLogger("tracking")

HISTOGRAMS = ("policy_lag_counts",)  # record keys that hold counts per bin 0, 1, ...: logged as histograms
FINAL_EVALUATION_PREFIX = "final_evaluation/"
TENSORBOARD_DIR = "tensorboard"


def _numbers(record: Mapping[str, Any]) -> dict[str, float]:
    """The scalars of a record (bools as 0/1, NaN kept: a skipped update's loss); lists and strings are
    left out."""
    return {key: float(value) if isinstance(value, (float, np.floating)) else int(value)
            for key, value in record.items() if isinstance(value, (bool, int, float, np.integer, np.floating))}


def quiet_wandb_environment() -> None:
    """Environment variables that keep wandb quiet, set unless the user set them.

    WANDB_DISABLE_WEAVE: wandb suggests its Weave product whenever a module named like an LLM library
    is imported, and `agents` (our networks) is on its list. WANDB_SILENT: no banner, no summary.
    """
    os.environ.setdefault("WANDB_DISABLE_WEAVE", "true")
    os.environ.setdefault("WANDB_SILENT", "true")


def _silent() -> bool:
    return os.environ.get("WANDB_SILENT", "true").strip().lower() not in ("false", "0", "no", "off")


def strict_json(record: Mapping[str, Any]) -> str:
    """`record` as one line of strict JSON: every non-finite float (NaN, +-inf, e.g. the loss of a
    skipped update) becomes null, so that any JSON reader can read metrics.jsonl."""
    def finite(value: Any) -> Any:
        if isinstance(value, (float, np.floating)):
            return float(value) if np.isfinite(value) else None
        if isinstance(value, Mapping):
            return {k: finite(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [finite(v) for v in value]
        return value
    return json.dumps(finite(record), allow_nan=False)


class WandbSink:
    """One wandb run (from `wandb.init`)."""

    def __init__(self, run: Any):
        self.run = run

    def log(self, record: Mapping[str, Any], step: int) -> None:
        """Every number of `record`, and each of HISTOGRAMS present as a wandb.Histogram, at `step`."""
        import wandb

        row: dict[str, Any] = _numbers(record)
        for key in HISTOGRAMS:
            if key in record:
                counts = np.asarray(record[key])
                row[key.removesuffix("_counts") + "_histogram"] = wandb.Histogram(
                    np_histogram=(counts, np.arange(len(counts) + 1)))
        self.run.log(row, step=step, commit=True)  # the step is complete: write it now, not at the next step

    def log_figures(self, figures: Mapping[str, Figure], step: int | None = None) -> None:
        """matplotlib figures as images under their keys, at `step` (None: wandb's next step)."""
        import wandb

        self.run.log({key: wandb.Image(fig) for key, fig in figures.items()}, step=step)

    def log_table(self, key: str, columns: list[str], rows: list[list]) -> None:
        """Rows under `columns` as a wandb.Table."""
        import wandb

        self.run.log({key: wandb.Table(columns=columns, data=rows)})

    def log_summary(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """`metrics` as the run's summary values, and as history at `step` (the final one by default)."""
        numbers = _numbers(metrics)
        if step is not None:
            self.run.log(numbers, step=step)
        self.run.summary.update(numbers)

    def finish(self) -> None:
        """Write the run's last records and close it."""
        self.run.finish()


class TensorBoardSink:
    """One TensorBoard event directory (torch.utils.tensorboard.SummaryWriter)."""

    def __init__(self, log_dir: Path, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(str(self.log_dir), purge_step=purge_step)
        self.last_step = 0

    def log(self, record: Mapping[str, Any], step: int) -> None:
        """Every number of `record` as a scalar, and each of HISTOGRAMS present as a histogram, at `step`."""
        for key, value in _numbers(record).items():
            self.writer.add_scalar(key, value, global_step=step)
        for key in HISTOGRAMS:
            if key in record:
                self._histogram(key.removesuffix("_counts") + "_histogram", np.asarray(record[key]), step)
        self.last_step = step
        self.writer.flush()

    def _histogram(self, tag: str, counts: np.ndarray, step: int) -> None:
        """Counts per integer bin 0, 1, ... as a TensorBoard histogram (bucket i ends at i + 0.5)."""
        values = np.arange(len(counts), dtype=np.float64)
        total = float(counts.sum())
        if total <= 0:
            return
        used = np.flatnonzero(counts)
        self.writer.add_histogram_raw(tag, min=float(used[0]), max=float(used[-1]), num=total,
                                      sum=float((values * counts).sum()),
                                      sum_squares=float((values ** 2 * counts).sum()),
                                      bucket_limits=(values + 0.5).tolist(), bucket_counts=counts.tolist(),
                                      global_step=step)

    def log_figures(self, figures: Mapping[str, Figure], step: int | None = None) -> None:
        """matplotlib figures as images, at `step` (None: the last step logged)."""
        for key, fig in figures.items():
            self.writer.add_figure(key, fig, global_step=self.last_step if step is None else step, close=False)
        self.writer.flush()

    def log_table(self, key: str, columns: list[str], rows: list[list]) -> None:
        """A table as markdown text (TensorBoard has no table type)."""
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
        self.writer.add_text(key, "\n".join(lines), global_step=self.last_step)
        self.writer.flush()

    def log_summary(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """The numbers of `metrics` as scalars, at `step` (None: the last step logged)."""
        for key, value in _numbers(metrics).items():
            self.writer.add_scalar(key, value, global_step=self.last_step if step is None else step)
        self.writer.flush()

    def finish(self) -> None:
        """Flush and close the event file."""
        self.writer.close()


class Tracker:
    """The trackers a config selects, called as one. With none selected every call does nothing."""

    def __init__(self, sinks: list):
        self.sinks = sinks

    def __bool__(self) -> bool:
        return bool(self.sinks)

    def log(self, record: Mapping[str, Any], step: int) -> None:
        """A metrics record (as metrics.jsonl holds it) at learner update `step`."""
        for sink in self.sinks:
            sink.log(record, step)

    def log_figures(self, figures: Mapping[str, Figure], step: int | None = None) -> None:
        """matplotlib figures by key (`report/<section>/<n>`); the caller closes them."""
        for sink in self.sinks:
            sink.log_figures(figures, step)

    def log_table(self, key: str, columns: list[str], rows: list[list]) -> None:
        """A small table (the league's payoff): a wandb.Table, markdown text in TensorBoard."""
        for sink in self.sinks:
            sink.log_table(key, columns, rows)

    def log_summary(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Numbers that describe the whole run (a final evaluation): wandb's summary, TensorBoard scalars."""
        for sink in self.sinks:
            sink.log_summary(metrics, step)

    def finish(self) -> None:
        """Close every tracker; later calls do nothing."""
        for sink in self.sinks:
            sink.finish()
        self.sinks = []


def start_tracking(cfg: Config, run_dir: str | Path, name: str, step: int = 0, announce: bool = True) -> Tracker:
    """The trackers `cfg.run` selects for the learner `name` (the wandb id and the TensorBoard folder).

    step: the learner's update step at the start, > 0 when it resumed from a checkpoint: TensorBoard
    drops what an earlier process logged after that step, wandb continues the run with that id.
    announce: log where each tracker writes (False for the final evaluation's few numbers: the run's
    closing lines give the upload command of all its segments).
    """
    run_dir = Path(run_dir)
    sinks: list = []
    if cfg.run.wandb_mode != "disabled":
        sinks.append(WandbSink(_wandb_init(cfg, run_dir, name, announce)))
    if cfg.run.tensorboard:
        # Events an earlier process logged after the checkpoint it resumed from describe lost training.
        sinks.append(TensorBoardSink(run_dir / TENSORBOARD_DIR / name, purge_step=step + 1 if step else None))
        log.log(logging.INFO if announce else logging.DEBUG, "tensorboard: %s (tensorboard --logdir %s)", run_dir / TENSORBOARD_DIR / name,
                 run_dir / TENSORBOARD_DIR)
    return Tracker(sinks)


def offline_segments(run_dir: str | Path, name: str) -> list[Path]:
    """The offline wandb directories of run id `name` under `run_dir`, oldest first: one per process
    that logged to it (a resumed run adds one)."""
    # wandb names them offline-run-<time>-<id>[-<n>]; the id is that of the transaction log inside.
    return sorted(p.parent for p in (Path(run_dir) / "wandb").glob(f"offline-run-*/run-{name}.wandb"))


def _wandb_init(cfg: Config, run_dir: Path, name: str, announce: bool = True) -> Any:
    quiet_wandb_environment()
    import wandb

    settings = wandb.Settings(silent=_silent(), console="off", show_colors=False, show_emoji=False)
    run = wandb.init(project=cfg.run.wandb_project, name=name, group=cfg.run.name, id=name, resume="allow",
                     dir=str(run_dir), mode=cfg.run.wandb_mode, settings=settings,
                     config=json.loads(json.dumps(_plain(without_secrets(cfg)))))
    if not announce:
        return run
    if cfg.run.wandb_mode == "offline":
        segments = offline_segments(run_dir, name)
        # The wandb command beside this Python (the project's .venv), runnable as printed without activating it.
        beside = Path(sys.executable).with_name("wandb")
        wandb_cmd = str(beside) if beside.exists() else "wandb"
        if len(segments) > 1:
            log.info("wandb: offline run %s continues in %s (segment %d; `%s sync --id %s %s` uploads the "
                     "segments in order as one run)", name, Path(run.dir).parent, len(segments), wandb_cmd, name,
                     " ".join(str(s) for s in segments))
        else:
            log.info("wandb: offline run %s in %s (`%s sync %s` uploads it)", name, Path(run.dir).parent, wandb_cmd,
                     Path(run.dir).parent)
    else:
        log.info("wandb: %s run %s%s", cfg.run.wandb_mode, name, f" {run.url}" if getattr(run, "url", None) else "")
    return run


def _plain(cfg: Config) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(cfg))  # type: ignore[return-value]


def log_final_evaluation(cfg: Config, run_dir: str | Path, metrics: Mapping[str, float],
                         step: int | None = None) -> None:
    """Log a flat dict of final-evaluation numbers (e.g. `{"vs_random/player_1/win_rate": 0.9}`) to the
    trackers `cfg` selects for the run in `run_dir`, under `final_evaluation/<key>`: the main learner's
    wandb run (its summary, and its history at `step` if given) and its TensorBoard folder (scalars at
    `step`, else at 0). Non-numbers are left out. One call after `run.py train`'s evaluation, e.g.
    `log_final_evaluation(cfg, run_dir, flat_results, step=checkpoint_step)`."""
    tracker = start_tracking(cfg, run_dir, cfg.run.name, step=0, announce=False) if _any(cfg) else Tracker([])
    try:
        tracker.log_summary({FINAL_EVALUATION_PREFIX + k: v for k, v in metrics.items()}, step)
    finally:
        tracker.finish()


def _any(cfg: Config) -> bool:
    return cfg.run.wandb_mode != "disabled" or cfg.run.tensorboard
