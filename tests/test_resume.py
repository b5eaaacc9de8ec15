"""Resume and records: `train --resume RUN_DIR` from the directory alone, a learning-rate schedule and a
time budget that go on where they stopped, counters that continue, the final evaluation kept in
evaluation.json and shown by the report, and `run.py config`.

One run of about 3 s of training (run.max_minutes=0.05, embedded Redis, a checkpoint every second), resumed
by its directory for 3 s more (run.max_minutes=0.1 in all), is shared by the tests of this module.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import yaml

from impala_league import REPO
from impala_league.analysis.report import _broken, build_report
from impala_league.analysis.runs import load_run

pytestmark = pytest.mark.redis  # its tests start their own redis-server where they use no fixture's

LR = 1e-3
BUDGET_S = 6.0  # the run's time budget in all: run.max_minutes=0.1; the first run stops at half of it


def run_py(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "IMPALA_REDIS_URL"}
    return subprocess.run([sys.executable, str(REPO / "run.py"), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    first = run_py("train", "--config", str(REPO / "configs/tictactoe.yaml"), "--eval-games", "0",
                   "--set", "run.name=sched", "--set", f"run.dir={tmp}", "--set", "run.wandb_mode=disabled",
                   "--set", "run.total_agent_steps=100000000", "--set", "run.max_minutes=0.05", "--set", "run.log_every_s=1",
                   "--set", "learner.lr_schedule=linear", "--set", f"learner.learning_rate={LR}",
                   "--set", "actor.num_actors=1", "--set", "actor.num_envs=4", "--set", "agent.hidden=16",
                   "--set", "learner.checkpoint_every_s=1")  # copies in checkpoints/history/ to play after the resume
    assert first.returncode == 0, first.stdout + first.stderr
    run_dir = tmp / "sched"
    before = json.loads((run_dir / "checkpoints" / "latest.json").read_text())
    second = run_py("train", "--resume", str(run_dir), "--set", "run.max_minutes=0.1", "--eval-games", "3",
                    "--eval-history-games", "2")
    assert second.returncode == 0, second.stdout + second.stderr
    after = json.loads((run_dir / "checkpoints" / "latest.json").read_text())
    return run_dir, before, after, second


def test_resume_by_directory_alone_continues_the_run_with_its_own_config(resumed):
    run_dir, before, after, second = resumed
    assert f"resumed from {run_dir / 'checkpoints' / 'latest.safetensors'} at update {before['step']:,}" in second.stdout
    assert after["step"] > before["step"] and after["agent_steps_trained"] > before["agent_steps_trained"]
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["run"]["max_minutes"] == 0.1 and saved["learner"]["lr_schedule"] == "linear"  # --set applied
    assert not (run_dir.parent / "sched-2").exists()


def test_resume_by_directory_refuses_a_config_file_beside_it(resumed):
    run_dir = resumed[0]
    proc = run_py("train", "--resume", str(run_dir), "--config", str(REPO / "configs/tictactoe.yaml"))
    assert proc.returncode == 2 and "drop --config" in proc.stderr


def test_a_resumed_run_continues_its_learning_rate_schedule_and_its_time_budget(resumed):
    run_dir, before, after, _ = resumed
    assert BUDGET_S / 2 <= before["elapsed_s"] < BUDGET_S / 2 + 2  # run.max_minutes=0.05 of training
    # The budget is the run's: 0.1 minutes in all, not 0.1 more.
    assert BUDGET_S <= after["elapsed_s"] < BUDGET_S + 2
    records = load_run(run_dir).records
    resumed_records = [r for r in records if r["learner_started"] != records[0]["learner_started"]]
    first = resumed_records[0]
    # linear: lr * (1 - elapsed / 6 s); the resumed learner starts at elapsed >= 3 s, so at half or less.
    assert first["learning_rate"] <= LR * (1 - before["elapsed_s"] / BUDGET_S) + 1e-9
    # And no lower than the schedule at the record's time: the rate was set by the record's last update,
    # between the resume and the record (a busy machine may put a second between them).
    assert first["learning_rate"] >= LR * max(0.0, 1 - first["elapsed_s"] / BUDGET_S) - 1e-9


def test_counters_and_the_time_axis_continue_across_the_resume_and_the_gap_is_not_drawn(resumed):
    run_dir, before, _, _ = resumed
    run = load_run(run_dir)
    segments = run.segments()
    assert len(segments) == 2, [r["learner_started"] for r in run.records]
    old, new = segments
    times = [run.elapsed(r) for r in run.records]
    assert times[0] >= 0 and times == sorted(times)  # never negative, never back
    assert run.elapsed(new[0]) >= before["elapsed_s"]
    for key in ("unrolls_trained", "unrolls_produced"):  # a new embedded Redis counted from 0 again
        assert new[0][key] >= old[-1][key] - 64, key
    xs, _ = _broken(run, run.records, run.elapsed, lambda r: r["sps"])
    assert math.isnan(xs[len(old)]) and sum(math.isnan(x) for x in xs) == 1


def test_the_final_evaluation_is_saved_with_step_frames_seed_and_shown_in_the_report(resumed):
    run_dir, _, after, second = resumed
    record = json.loads((run_dir / "evaluation.json").read_text())
    assert record["step"] == after["step"] and record["agent_steps_trained"] == after["agent_steps_trained"] and record["seed"] == 0
    assert set(record["opponents"]) == {"random", "tactical", "minimax:9"}
    for seats in record["opponents"].values():
        assert set(seats) == {"player_1", "player_2"}
        assert all(s["games"] == 3 and s["wins"] + s["draws"] + s["losses"] == 3 for s in seats.values())
    page = build_report([run_dir])
    assert "final evaluation" in page and "minimax:9" in page and f"at update {after['step']}" in page
    assert "evaluation.json" in second.stdout


def test_the_final_evaluation_plays_earlier_checkpoints_and_shows_the_tactics(resumed):
    run_dir, _, after, second = resumed
    record = json.loads((run_dir / "evaluation.json").read_text())
    over = record["over_training"]
    steps = [e["step"] for e in over]
    # At least one copy from checkpoints/history/ (one per second of training), then the final checkpoint.
    assert len(over) >= 2 and steps == sorted(set(steps)) and steps[-1] == after["step"], steps
    assert [e["games"] for e in over] == [2] * (len(over) - 1) + [3]
    assert over[0]["checkpoint"].startswith(str(run_dir / "checkpoints" / "history"))
    for entry in over:
        assert set(entry["opponents"]) == {"tactical", "minimax:9"}
        for seats in entry["opponents"].values():
            assert all({"wins_taken_rate", "blocks_made_rate"} <= set(r["tactics"]) for r in seats.values())
    # The log shows each opponent's tactics per seat, and how the earlier policies played.
    assert second.stdout.count("immediate wins") >= 6 and "forced blocks" in second.stdout
    assert f"over training: {len(over) - 1} earlier policies, 2 games per seat and bot" in second.stdout


def test_config_prints_the_resolved_config_of_a_file_and_overrides():
    proc = run_py("config", "--config", str(REPO / "configs/tictactoe.yaml"), "--set", "learner.batch_size=7",
                  "--set", "run.redis_url=redis://:secret@host:6379/0")
    assert proc.returncode == 0, proc.stderr
    printed = yaml.safe_load(proc.stdout)
    assert printed["learner"]["batch_size"] == 7 and printed["env"]["name"] == "tictactoe"
    assert "secret" not in proc.stdout
