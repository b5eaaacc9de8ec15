"""Experiment tracking (tracking.py): TensorBoard beside wandb with the same metrics, a quiet wandb that
writes no ANSI codes, resumed runs, the final evaluation, and the report's figures."""

from __future__ import annotations

import logging
import os
import pty
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from impala_league import REPO
from impala_league.config import load_config
from tests.analysis.test_report import _run_dir
from impala_league.tracking import TensorBoardSink, Tracker, log_final_evaluation, offline_segments, start_tracking


RECORDS = [  # two metrics records as the learner writes them (metrics.jsonl), at updates 4 and 8
    {"loss": 0.5, "entropy": 1.9, "sps": 1200.0, "policy_lag": 0.75, "skipped_updates": 0, "step": 4,
     "agent_steps_trained": 2560, "policy_lag_counts": [2, 1, 1]},
    {"loss": 0.25, "entropy": 1.5, "sps": 1500.0, "policy_lag": 0.5, "skipped_updates": 1, "step": 8,
     "agent_steps_trained": 5120, "policy_lag_counts": [3, 0, 1], "first_seat_win_rate": 0.625},
]
SCALARS = {"loss", "entropy", "sps", "policy_lag", "skipped_updates", "step", "agent_steps_trained", "first_seat_win_rate"}


@pytest.fixture
def quiet_env(monkeypatch):
    """A clean wandb environment; whatever tracking.py sets is undone after the test."""
    for name in ("WANDB_SILENT", "WANDB_DISABLE_WEAVE", "WANDB_CONSOLE", "WANDB_MODE", "WANDB_DIR"):
        monkeypatch.delenv(name, raising=False)


def _events(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "histograms": 0, "images": 0,
                                                          "tensors": 0})
    events.Reload()
    return events


def _scalars(events, tag: str) -> list[tuple[int, float]]:
    return [(e.step, pytest.approx(e.value)) for e in events.Scalars(tag)]


def test_tensorboard_gets_the_metrics_wandb_gets(tmp_path, quiet_env):
    cfg = load_config(None, ["run.name=same", "run.wandb_mode=offline", "run.tensorboard=true"])
    tracker = start_tracking(cfg, tmp_path, "same")
    for record in RECORDS:
        tracker.log(record, record["step"])
    wandb_run = tracker.sinks[0].run
    logged_to_wandb = {k for k in wandb_run.summary.keys() if not k.startswith("_")}
    last_wandb = {k: wandb_run.summary[k] for k in SCALARS}
    tracker.finish()

    events = _events(tmp_path / "tensorboard" / "same")
    assert set(events.Tags()["scalars"]) == SCALARS
    assert logged_to_wandb == SCALARS | {"policy_lag_histogram"}
    assert set(events.Tags()["histograms"]) == {"policy_lag_histogram"}
    assert _scalars(events, "loss") == [(4, 0.5), (8, 0.25)]
    assert _scalars(events, "first_seat_win_rate") == [(8, 0.625)]
    assert {k: events.Scalars(k)[-1].value for k in SCALARS} == pytest.approx(last_wandb)
    lags = events.Histograms("policy_lag_histogram")
    assert [h.step for h in lags] == [4, 8]
    # [2, 1, 1] unrolls at lags 0, 1, 2: 4 unrolls, lag sum 3, sum of squares 5, buckets ending at 0.5, 1.5, 2.5
    first = lags[0].histogram_value
    assert (first.num, first.sum, first.sum_squares, first.min, first.max) == (4, 3, 5, 0, 2)
    assert list(first.bucket) == [2, 1, 1] and list(first.bucket_limit) == [0.5, 1.5, 2.5]


def _read_all(fd: int, out: bytearray) -> None:
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: every writer closed the terminal
            return
        if not chunk:
            return
        out += chunk


def test_wandb_is_quiet_on_a_terminal_and_writes_no_ansi_codes(tmp_path):
    """On a terminal (where wandb colours its lines) a learner's tracking prints nothing of wandb's: no
    banner, no sparkline summary, no Weave advertisement (set off by the name of our `agents` package),
    and no file of the run holds an ANSI escape code."""
    code = ("import impala_league.agents.heads\nfrom impala_league import tracking\n"
            "from impala_league.config import load_config\n"
            f"cfg = load_config(None, ['run.name=quiet', 'run.wandb_mode=offline'])\n"
            f"tracker = tracking.start_tracking(cfg, {str(tmp_path)!r}, 'quiet')\n"
            "tracker.log({'loss': 0.5, 'policy_lag_counts': [2, 1]}, 1)\n"
            "tracker.finish()\n"
            "print('done')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdin=terminal, stdout=terminal,
                            stderr=terminal)
    os.close(terminal)
    output = bytearray()
    reader = threading.Thread(target=_read_all, args=(controller, output))
    reader.start()
    try:
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
        reader.join(timeout=10)
        os.close(controller)
    text = output.decode(errors="replace")
    assert "done" in text
    assert "\x1b[" not in text, text
    assert [line for line in text.splitlines() if "wandb" in line.lower() or "weave" in line.lower()] == []
    assert len(offline_segments(tmp_path, "quiet")) == 1
    escaped = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".wandb" and b"\x1b[" in p.read_bytes()]
    assert escaped == []


def test_a_resumed_run_continues_its_tensorboard_and_wandb_run(tmp_path, quiet_env, caplog):
    cfg = load_config(None, ["run.name=again", "run.wandb_mode=offline", "run.tensorboard=true"])
    first = start_tracking(cfg, tmp_path, "again")
    for step in (1, 2, 3):  # the process dies after update 3; its checkpoint is at update 2
        first.log({"loss": float(step)}, step)
    first.finish()
    with caplog.at_level(logging.INFO, logger="tracking"):
        resumed = start_tracking(cfg, tmp_path, "again", step=2)
        resumed.log({"loss": 30.0}, 3)
        resumed.log({"loss": 40.0}, 4)
        resumed.finish()
    # Update 3 of the dead process is gone; the resumed updates follow the checkpoint's.
    assert _scalars(_events(tmp_path / "tensorboard" / "again"), "loss") == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]
    segments = offline_segments(tmp_path, "again")
    assert len(segments) == 2 and all((s / "run-again.wandb").is_file() for s in segments)
    assert sorted((tmp_path / "wandb").glob("offline-run-*")) == segments  # no run under another id
    message = next(r.getMessage() for r in caplog.records if r.name == "tracking" and "continues" in r.getMessage())
    assert f"continues in {segments[1]} (segment 2;" in message
    assert f"wandb sync --id again {segments[0]} {segments[1]}" in message


def test_the_final_evaluation_is_logged_in_one_call(tmp_path, quiet_env):
    cfg = load_config(None, ["run.name=final", "run.wandb_mode=offline", "run.tensorboard=true"])
    tracker = start_tracking(cfg, tmp_path, "final")
    tracker.log({"loss": 0.5}, 7)
    tracker.finish()
    log_final_evaluation(cfg, tmp_path, {"vs_random/player_1/win_rate": 0.9, "vs_random/games": 100,
                                         "checkpoint": "latest.safetensors"}, step=7)
    events = _events(tmp_path / "tensorboard" / "final")
    assert set(events.Tags()["scalars"]) == {"loss", "final_evaluation/vs_random/player_1/win_rate",
                                             "final_evaluation/vs_random/games"}
    assert _scalars(events, "final_evaluation/vs_random/player_1/win_rate") == [(7, 0.9)]
    assert len(offline_segments(tmp_path, "final")) == 2  # the learner's, then the evaluation's
    disabled = load_config(None, ["run.name=final", "run.wandb_mode=disabled"])
    log_final_evaluation(disabled, tmp_path / "nothing", {"win_rate": 1.0})  # no tracker: nothing happens
    assert not (tmp_path / "nothing").exists()


def test_the_report_figures_go_to_tensorboard(tmp_path):
    from impala_league.analysis.report import log_report

    run_dir = _run_dir(tmp_path, "league-run", ["league.enabled=true"])
    (run_dir / "league").mkdir()
    (run_dir / "league" / "state.json").write_text('{"payoff": [["main", "random", 8, 1, 1]]}')
    tracker = Tracker([TensorBoardSink(tmp_path / "tb")])
    log_report(run_dir, tracker)
    tracker.finish()
    events = _events(tmp_path / "tb")
    images = events.Tags()["images"]
    # architecture, 3 learning plots, throughput, lag, vtrace, league payoff heatmap (no ratings.jsonl)
    assert len(images) == 8 and "report/architecture/0" in images and "report/league/0" in images
    table = events.Tensors("report/payoff/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| main | random | 8 | 1 | 1 |" in table
