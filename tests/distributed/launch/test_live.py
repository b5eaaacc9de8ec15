"""The live terminal view of run.py train: the bar follows metrics.jsonl as the learner appends to it."""

from __future__ import annotations

import io
import json

from rich.console import Console

from impala_league.config import load_config
from impala_league.distributed.launch.live import LiveView, clock, describe, progress_to_end


def test_bar_follows_the_metrics_file_and_ignores_a_half_written_line(tmp_path):
    cfg = load_config(None, ["run.total_agent_steps=1000", "run.name=live"])
    metrics = tmp_path / "metrics.jsonl"
    out = io.StringIO()
    view = LiveView(cfg, metrics, Console(file=out, force_terminal=True, width=200))
    assert view.refresh() is None  # no file yet
    record = {"agent_steps_trained": 250, "sps": 1234.4, "policy_lag": 1.25, "queue_depth": 7, "first_seat_win_rate": 0.5}
    metrics.write_text(json.dumps(record) + "\n" + '{"agent_steps_trained": 9')
    with view:
        assert view.refresh() == record
        task = view.progress.tasks[0]
        assert task.completed == 0.25 and task.fields["steps"] == "250 / 1,000 agent steps"
        assert view.status.plain == "SPS 1,234  lag 1.2  queue 7  first-seat wins 0.50"
        with metrics.open("a") as f:
            f.write('00, "sps": 10, "policy_lag": 0, "queue_depth": 0, "episode_return": 21.5}\n')
        assert view.refresh()["agent_steps_trained"] == 900  # the completed line, read from where the last read stopped
        assert view.progress.tasks[0].fields["eta"] == "ends in ~0:10 (agent steps)"  # 100 steps at 10 SPS
        view.print_line("actor 0: a child's log line")
        view.evaluating("evaluating the final policy")
    assert view.progress.tasks[0].completed == 1.0
    text = out.getvalue()
    assert "actor 0: a child's log line" in text and "900 / 1,000 agent steps" in text
    assert "evaluating the final policy" in text


def test_the_bar_runs_to_the_time_limit_when_it_comes_first():
    record = {"agent_steps_trained": 100_000, "elapsed_s": 270.0, "sps": 1000.0}
    # 900k steps left at 1,000/s would take 15 min; the 5-minute limit has 30 s left: the limit ends it.
    assert progress_to_end(record, 1_000_000, 5.0) == (0.9, "ends in ~0:30 (time limit)")
    # Without a limit the agent steps end it: 900 s left.
    assert progress_to_end(record, 1_000_000, 0.0) == (0.1, "ends in ~15:00 (agent steps)")
    # The steps end it before a generous limit.
    assert progress_to_end({**record, "sps": 1e5}, 1_000_000, 60.0) == (0.1, "ends in ~0:09 (agent steps)")
    assert clock(3909) == "1:05:09"


def test_description_names_the_score_the_run_has():
    assert describe({"sps": 10, "policy_lag": 0, "queue_depth": 1, "league_score": 0.25}).endswith("league score 0.25")
    assert "return 3.00" in describe({"episode_return": 3.0})
