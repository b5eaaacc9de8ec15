"""Processes of a training run: an embedded Redis (unless one is given), the learners, the league
manager (when the league is on) and the actors.

`run.py train` calls `supervise`; `run.py actors` calls `supervise_actors` (the actors of one host of a
run whose learner runs elsewhere). Both restart their children by the same rules (`Workers`). Children
are `run.py learner|league|actor` processes, the same commands a multi-machine deployment starts by
hand, reading the run's resolved config file (`actors`: the user's config and --set). The Redis URL
(with its password) reaches them through the environment, never the command line.

This module holds the run's role table (`worker_commands`, `learner_rank_args`) and the two supervisors;
starting, stopping and restarting a child is `children.py`'s, the embedded Redis `embedded_redis.py`'s.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import redis

from impala_league.config import Config
from impala_league.distributed.launch.children import (REDIS_URL_ENV, STOP_SIGNALS, Workers, describe_exit,
                                                       restart_budget, spawn, stop_all)
# EmbeddedRedis and redis_server_binary: `run.py train` and the tests start the run's Redis through here
from impala_league.distributed.launch.embedded_redis import EmbeddedRedis, free_port, redis_server_binary
from impala_league.distributed.launch.ownership import PEER_LOST_EXIT, stopped_exit_code
from impala_league.distributed.wire import keys
from impala_league.distributed.wire.params import ParamStore
from impala_league.distributed.wire.transport import connect, run_is_over
from impala_league.league.players import MAIN, learner_players, namespace
from impala_league.league.store import LeagueStore

if TYPE_CHECKING:
    from impala_league.distributed.launch.live import LiveView

__all__ = ["REDIS_URL_ENV", "EmbeddedRedis", "Workers", "learner_rank_args", "redis_server_binary", "supervise",
           "supervise_actors", "worker_commands"]

log = logging.getLogger("launcher")


def worker_commands(cfg: Config, run_dir: Path, resume: bool) -> dict[str, tuple[str, list[str], int]]:
    """Every process of the run except the main learner: name -> (role, extra args, niceness).

    Actors 0..num_actors-1 serve the main agent; each exploiter learner gets `league.exploiter_actors`
    actors with the next ids, and it and they run at niceness `league.exploiter_nice`; the main agent's
    actors at `actor.nice`.
    """
    run_args = ["--run-dir", str(run_dir)] + (["--resume"] if resume else [])
    commands: dict[str, tuple[str, list[str], int]] = {}
    if cfg.league.enabled:
        commands["league manager"] = ("league", run_args, 0)
    next_id = 0
    for player in learner_players(cfg):
        nice = cfg.actor.nice if player == MAIN else cfg.league.exploiter_nice
        if player != MAIN:
            commands[f"learner {player}"] = ("learner", run_args + ["--player", player], nice)
        for _ in range(cfg.actor.num_actors if player == MAIN else cfg.league.exploiter_actors):
            commands[f"actor {next_id}"] = ("actor", ["--actor-id", str(next_id), "--player", player], nice)
            next_id += 1
    return commands


def learner_rank_args(cfg: Config, run_dir: Path, resume: bool, dist_url: str | None = None) -> list[list[str]]:
    """`run.py learner` arguments of the main agent's learners, rank 0 first: one learner, or with
    `learner.num_learners` = K, K ranks that meet at `dist_url`, by default a free loopback port that
    rank 0 will listen on (distributed/learner/data_parallel.py; on several machines: rank 0's address and an
    open port, as deploy/k8s.py and slurm.py give them)."""
    args = ["--run-dir", str(run_dir)] + (["--resume"] if resume else [])
    size = cfg.learner.num_learners
    if size == 1:
        return [args]
    url = dist_url or f"tcp://127.0.0.1:{free_port()}"
    return [args + ["--rank", str(rank), "--dist-url", url] for rank in range(size)]


def _failed_rank(ranks: list[subprocess.Popen]) -> str | None:
    """Which of the learner ranks 1..K-1 (`ranks[r - 1]`) exited with an error of its own, if any: the
    cause of a failed run. Ranks that exited with PEER_LOST_EXIT (their collective failed because
    another rank was gone; rank 0 too) are its casualties, not its cause."""
    for rank, proc in enumerate(ranks, start=1):
        code = proc.poll()
        if code is not None and code not in (0, PEER_LOST_EXIT):
            return f"learner rank {rank} (pid {proc.pid}) {describe_exit(code)}"
    return None


def _ending(cfg: Config, run_dir: Path, client: redis.Redis, learner: subprocess.Popen | None,
            ranks: list[subprocess.Popen], received: list[int], failure: str) -> tuple[int, bool]:
    """What `supervise` returns once every child is stopped, (exit code, finished), after logging why a
    failed run failed and how to go on. `received`: the stop signals, in order; `failure`: why the
    supervisor stopped the run ("" when it did not)."""
    if not failure and not received and learner is not None and learner.returncode == PEER_LOST_EXIT:
        failure = _failed_rank(ranks) or ""  # rank 0 failed because this rank died first
    if failure:
        has_checkpoint = (run_dir / "checkpoints" / "latest.safetensors").exists()
        hint = f"; `run.py train --resume {run_dir}` continues from its last checkpoint" if has_checkpoint and ranks else ""
        log.error("%s%s", failure, hint)
        return 1, False
    if received:
        return 128 + received[0], run_is_over(client, cfg.run.name)  # ended while the learner was closing
    code = learner.returncode
    if code != 0:
        has_checkpoint = (run_dir / "checkpoints" / "latest.safetensors").exists()
        hint = (f"`run.py train --resume {run_dir}` continues from its last checkpoint" if has_checkpoint
                else "It wrote no checkpoint: start the run again")
        log.error("the learner (%spid %d) %s (see its output above); the actors are stopped. %s",
                  "rank 0, " if ranks else "", learner.pid, describe_exit(code), hint)
        return (code if code > 0 else 1), False
    return 0, run_is_over(client, cfg.run.name)


def _clear_run_keys(client: redis.Redis, cfg: Config, resume: bool) -> None:
    """Unset the run's done key; without `resume` also drop the weights, opponents and results another
    run of this name left, which must not reach this one."""
    client.delete(keys.done(cfg.run.name))
    if not resume:
        for player in learner_players(cfg):
            ParamStore(client, namespace(cfg.run.name, player)).clear()
        LeagueStore(client, cfg.run.name).clear_opponents()
        client.delete(keys.results(cfg.run.name))


def _count_stop_signals(received: list[int], second: str) -> dict:
    """Handle STOP_SIGNALS by appending each to `received`; at the second, say on stderr "<SIGNAL> again:
    `second`". Returns the handlers of before, to put back once every child is stopped."""

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        if len(received) == 2:  # print, not log: a handler may interrupt a log call of this thread
            print(f"{signal.Signals(signum).name} again: {second}", file=sys.stderr, flush=True)

    return {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}


def supervise(cfg: Config, config_path: Path, run_dir: Path, redis_url: str, resume: bool,
              view: "LiveView | None" = None) -> tuple[int, bool]:
    """Start the learners, the league manager and the actors; restart crashed ones; stop all when the
    main learner ends. With `view` (a terminal), the children's output and the progress go through it.

    Returns (exit code, finished). finished: the main learner reached the end of the run (its done key is
    set), also when a signal came while it was closing. The code: 0 after the end; 128 + the signal's
    number after SIGINT (130), SIGTERM or SIGHUP, which stop every child and let the learners write a
    final checkpoint (a second one kills them at once); a positive code when the learner died or the
    workers kept crashing.
    """
    client = connect(redis_url, retry_s=cfg.run.redis_retry_s)
    _clear_run_keys(client, cfg, resume)
    received: list[int] = []  # the stop signals, in order
    failure = ""
    # Installed before the first child exists, and kept until the last one is stopped: a Ctrl-C, a
    # SIGTERM or a closed terminal (SIGHUP) must never leave children running in their own sessions.
    old_handlers = _count_stop_signals(received, "killing every process of the run now (the learners keep their "
                                                 "last checkpoint on disk)")
    learner = None
    workers = Workers(worker_commands(cfg, run_dir, resume), config_path, redis_url, client, cfg.run.name,
                      restart_budget(cfg), view)
    ranks: list[subprocess.Popen] = []  # learner ranks 1..K-1 of learner.num_learners (rank 0 is `learner`)
    try:
        learner_args = learner_rank_args(cfg, run_dir, resume)
        learner = spawn("learner", config_path, redis_url, learner_args[0], view=view)
        ranks = [spawn("learner", config_path, redis_url, args, view=view) for args in learner_args[1:]]
        workers.start()
        # With learner.algo=a3c the learner process is A3C's parameter server (run.py learner picks it).
        log.info("started the %s (pid %d) and %s", "parameter server" if cfg.learner.algo == "a3c" else "learner",
                 learner.pid,
                 ", ".join([f"learner rank {r} (pid {p.pid})" for r, p in enumerate(ranks, start=1)]
                           + [f"{name} (pid {p.pid})" for name, p in workers.procs.items()]))
        while learner.poll() is None and not received and not failure:
            failure = _failed_rank(ranks) or ""  # a rank cannot rejoin its group: the run stops, --resume goes on
            if failure:
                break
            stop = workers.poll()
            if stop is not None:
                failure = stop.reason
                break
            if view is not None:
                view.refresh()
            time.sleep(0.5)
    finally:
        if received or failure:
            log.info("stopping: learners write a final checkpoint")
        everyone = dict(workers.procs, **({"learner": learner} if learner is not None else {}),
                        **{f"learner rank {r}": p for r, p in enumerate(ranks, start=1)})
        stop_all(everyone, forced=lambda: len(received) > 1)
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
    return _ending(cfg, run_dir, client, learner, ranks, received, failure)


def supervise_actors(cfg: Config, config_path: Path | None, overrides: list[str], redis_url: str, count: int,
                     player: str, wait_redis_s: float) -> int:
    """`run.py actors`: start `count` `run.py actor` processes on this host for learner `player` (each with
    `--config config_path`, the `overrides` as --set and --wait-redis `wait_redis_s`; each leases the
    lowest free actor id of the run) and keep them running until the run is over, with the rules of
    `supervise` (`Workers`): a crashed actor is restarted once its id is released.

    Returns the exit code: 0 when the run is over (its done key set: the actors end by themselves);
    USER_ERROR_EXIT when an actor exits with it (a config error: restarting is no remedy), 1 when the
    actors crashed faster than run.max_restarts per run.restart_window_s or Redis was lost, after stopping the
    others; 128 + N after stop signal N (SIGINT, SIGTERM, SIGHUP) before the run was over: every actor
    gets SIGTERM, and SIGKILL STOP_TIMEOUT_S["actor"] later or at a second signal. The actors die with
    this process, also when it is killed (`die_with_parent`)."""
    client = connect(redis_url, retry_s=cfg.run.redis_retry_s)
    received: list[int] = []
    old_handlers = _count_stop_signals(received, "killing every actor now")  # before the first child exists
    args = [arg for kv in overrides for arg in ("--set", kv)] + ["--player", player, "--wait-redis", f"{wait_redis_s:g}"]
    workers = Workers({f"actor #{i}": ("actor", args, 0) for i in range(1, count + 1)}, config_path, redis_url,
                      client, cfg.run.name, restart_budget(cfg))
    stop = None
    try:
        workers.start()
        for name, proc in workers.procs.items():
            log.info("started %s (pid %d)", name, proc.pid)
        while not received:
            stop = workers.poll()
            if stop is not None or len(workers.ended) == count:
                break
            time.sleep(0.5)
    finally:
        running = workers.alive()
        if running:
            log.info("stopping %d actors", len(running))
        stop_all(workers.procs, forced=lambda: len(received) > 1)
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        for name in running:
            log.info("%s (pid %d) %s", name, workers.procs[name].pid, describe_exit(workers.procs[name].returncode))
    if stop is not None:
        log.error("%s", stop.reason)
        return stop.code
    if received:
        code = stopped_exit_code(received[0], lambda: run_is_over(client, cfg.run.name))
        log.info("stopped by %s%s", signal.Signals(received[0]).name, "" if code else " after the end of the run")
        return code
    log.info("the run is over: all %d actors exited", count)
    return 0
