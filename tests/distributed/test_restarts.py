"""The supervisors' restart rule (distributed/restarts.py): a crash rate in a sliding window, so spaced
crashes over a long run are restarted for ever while a crash loop stops. `Workers` is driven with real
child processes that exit at once, a real Redis, and a simulated clock standing in for hours."""

from __future__ import annotations

import subprocess
import sys

import pytest

from impala_league.distributed import children
from impala_league.distributed.restarts import RestartBudget


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_window_counts_only_recent_restarts():
    clock = Clock()
    budget = RestartBudget(3, 10.0, clock)
    for t in (0.0, 1.0, 2.0):
        clock.now = t
        assert budget.take()
    clock.now = 9.9  # 3 restarts in the last 10 s: a fourth is over the budget, and not counted
    assert not budget.take()
    assert budget.total == 3
    clock.now = 10.0  # the restart at 0.0 has left the window
    assert budget.take()
    assert not budget.take()
    assert budget.describe() == "4 crashes within 10 s, more than run.max_restarts=3 per run.restart_window_s=10"


def test_spaced_crashes_go_on_for_ever_and_a_crash_loop_uses_up_the_budget():
    clock = Clock()
    budget = RestartBudget(20, 600.0, clock)
    for _ in range(24 * 60):  # a crash a minute for a simulated day: never more than 10 in a window
        clock.now += 60.0
        assert budget.take()
    assert budget.total == 1440
    loop = [budget.take() for _ in range(30)]  # then a child that dies at once, over and over
    assert loop == [True] * 10 + [False] * 20  # the 10 of the last 10 minutes plus 10 fill the budget


@pytest.mark.parametrize("max_restarts, window_s", [(-1, 10.0), (1, 0.0)])
def test_a_budget_that_means_nothing_is_refused(max_restarts, window_s):
    with pytest.raises(ValueError):
        RestartBudget(max_restarts, window_s)


def _workers(monkeypatch, client, run_name: str, clock: Clock) -> children.Workers:
    """Two actors whose every start is a process that exits with code 1 at once."""
    monkeypatch.setattr(children, "spawn", lambda *args, **kwargs: subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.exit(1)"]))
    commands = {f"actor #{i}": ("actor", ["--player", "main"], 0) for i in (1, 2)}
    workers = children.Workers(commands, None, "redis://unused", client, run_name, RestartBudget(20, 600.0, clock))
    workers.start()
    return workers


def _crash_all(workers: children.Workers) -> None:
    for proc in workers.procs.values():
        proc.wait(timeout=30)


@pytest.mark.redis
def test_workers_restart_spaced_crashes_over_a_long_run(monkeypatch, redis_client, run_name):
    clock = Clock()
    workers = _workers(monkeypatch, redis_client, run_name, clock)
    for _ in range(12):  # 24 crashes, two every 2 simulated minutes: more than 20 in all, at most 10 a window
        clock.now += 120.0
        _crash_all(workers)
        assert workers.poll() is None
    assert workers.budget.total == 24 and not workers.ended
    _crash_all(workers)


@pytest.mark.redis
def test_workers_stop_a_crash_loop_with_code_1(monkeypatch, redis_client, run_name):
    clock = Clock()
    workers = _workers(monkeypatch, redis_client, run_name, clock)
    stop = None
    for _ in range(20):
        clock.now += 1.0
        _crash_all(workers)
        stop = workers.poll()
        if stop is not None:
            break
    assert workers.budget.total == 20  # restarts 1-20 made; the 21st crash stopped everyone
    assert stop is not None and stop.code == 1
    assert "21 crashes within 600 s, more than run.max_restarts=20" in stop.reason
    assert stop.reason.endswith("giving up on a crash loop (see the errors above)")
    _crash_all(workers)
