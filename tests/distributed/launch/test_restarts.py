"""The supervisors' restart rule (distributed/launch/restarts.py): per child, a crash rate in a sliding window
of the crashes soon after its start, so spaced crashes over a long run, and one event that ends many
long-running children, are restarted while a crash loop stops. `Workers` is driven with real child
processes that exit at once, a real Redis, and a simulated clock standing in for hours."""

from __future__ import annotations

import math
import subprocess

import pytest

from impala_league import REPO
from impala_league.checked_config import load_config
from impala_league.distributed.launch import children
from impala_league.distributed.launch.restarts import RestartBudget


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_window_counts_only_recent_restarts():
    clock = Clock()
    budget = RestartBudget(3, 10.0, math.inf, clock)  # every crash counts
    for t in (0.0, 1.0, 2.0):
        clock.now = t
        assert budget.take("actor #1", 0.0)
    clock.now = 9.9  # 3 restarts in the last 10 s: a fourth is over the budget, and not counted
    assert not budget.take("actor #1", 0.0)
    assert budget.total == 3
    clock.now = 10.0  # the restart at 0.0 has left the window
    assert budget.take("actor #1", 0.0)
    assert not budget.take("actor #1", 0.0)
    assert budget.describe("actor #1") == ("4 crashes within 10 s, more than run.max_restarts=3 per "
                                           "run.restart_window_s=10")


def test_spaced_crashes_go_on_for_ever_and_a_crash_loop_uses_up_the_budget():
    clock = Clock()
    budget = RestartBudget(20, 600.0, math.inf, clock)
    for _ in range(24 * 60):  # a crash a minute for a simulated day: never more than 10 in a window
        clock.now += 60.0
        assert budget.take("actor #1", 0.0)
    assert budget.total == 1440
    loop = [budget.take("actor #1", 0.0) for _ in range(30)]  # then a child that dies at once, over and over
    assert loop == [True] * 10 + [False] * 20  # the 10 of the last 10 minutes plus 10 fill the budget


def test_each_child_has_its_own_budget_and_only_crashes_soon_after_a_start_count():
    clock = Clock()
    budget = RestartBudget(2, 600.0, 60.0, clock)
    assert all(budget.take(f"actor #{i}", 3600.0) for i in range(32))  # one event, 32 long-running actors
    assert all(budget.take(f"actor #{i}", 5.0) for i in range(32))  # each dies again at once: 1 of its 2
    assert budget.take("actor #0", 59.0) and not budget.take("actor #0", 1.0)  # its third in the window
    assert budget.take("actor #0", 60.0)  # a crash after a minute's run is not a loop: not counted
    assert budget.take("actor #1", 2.0) and budget.total == 32 + 32 + 1 + 1 + 1
    assert budget.describe("actor #0") == ("3 crashes within 600 s, each within run.crash_loop_s=60 s of its "
                                           "start, more than run.max_restarts=2 per run.restart_window_s=600")


@pytest.mark.parametrize("max_restarts, window_s, loop_s", [(-1, 10.0, 60.0), (1, 0.0, 60.0), (1, 10.0, 0.0)])
def test_a_budget_that_means_nothing_is_refused(max_restarts, window_s, loop_s):
    with pytest.raises(ValueError):
        RestartBudget(max_restarts, window_s, loop_s)


def _workers(monkeypatch, client, run_name: str, clock: Clock, count: int = 2,
             budget: RestartBudget | None = None) -> children.Workers:
    """`count` actors whose every start is a process that exits with code 1 at once."""
    monkeypatch.setattr(children, "spawn", lambda *args, **kwargs: subprocess.Popen(["sh", "-c", "exit 1"]))
    commands = {f"actor #{i}": ("actor", ["--player", "main"], 0) for i in range(1, count + 1)}
    budget = budget or RestartBudget(20, 600.0, 60.0, clock)
    workers = children.Workers(commands, None, "redis://unused", client, run_name, budget)
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
    for _ in range(30):
        clock.now += 1.0
        _crash_all(workers)
        stop = workers.poll()
        if stop is not None:
            break
    assert workers.budget.total == 40  # restarts 1-20 of each made; actor #1's 21st crash stopped everyone
    assert stop is not None and stop.code == 1 and stop.reason.startswith("actor #1 (pid ")
    assert "21 crashes within 600 s, each within run.crash_loop_s=60 s of its start, more than run.max_restarts=20" \
        in stop.reason
    assert stop.reason.endswith("giving up on a crash loop (see the errors above)")
    _crash_all(workers)


@pytest.mark.redis
def test_one_event_that_ends_32_long_running_actors_restarts_them_all(monkeypatch, redis_client, run_name):
    """The config's rule (run.max_restarts 20): 32 actors that ran for an hour die at once, then again a
    second after their restarts; both times every one is restarted."""
    clock = Clock()
    budget = children.restart_budget(load_config(str(REPO / "configs" / "tictactoe.yaml"), []))
    budget.clock = clock
    workers = _workers(monkeypatch, redis_client, run_name, clock, count=32, budget=budget)
    for elapsed in (3600.0, 1.0):
        first = {name: proc.pid for name, proc in workers.procs.items()}
        clock.now += elapsed
        _crash_all(workers)
        assert workers.poll() is None
        assert all(workers.procs[name].pid != pid for name, pid in first.items())  # each restarted
    assert workers.budget.total == 64
    _crash_all(workers)
