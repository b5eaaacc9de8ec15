"""One owner per run: an OS file lock on the run directory, held by `run.py train` for the run's life,
and the check its children make before they write into that directory.

The lock is `fcntl.flock` on `<run dir>/run.lock`, which names its holder (host and pid). The kernel
drops it when the holder exits, however it exits (kill -9 included), so a lock is never stale; the
file itself stays. Children (learners, the league manager) do not hold it: they get the launcher's pid
in `IMPALA_RUN_OWNER`. On Linux they die with the launcher (PR_SET_PDEATHSIG with SIGKILL, see
children.spawn); elsewhere `exit_with_launcher` ends them within a second, and before writing a
checkpoint or the league's state they check `owns_run_dir()`, so a child that outlives a killed launcher
never writes into a directory that a new `train --resume` may own by then.

The run directory's rules live here too: a fresh run never reuses a directory (`new_run_dir`), claims
and locks it (`claim_run_dir`), resumes only under settings its checkpoint fits (`check_resumable`),
and on a shared Redis holds its run name for its life (`run_lease`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Callable

import redis

from impala_league.config import Config, ConfigError, UserError, from_yaml_text, to_yaml, without_secrets
from impala_league.distributed.wire import keys
from impala_league.distributed.wire.transport import LearnerLease, LeaseHeld, RedisUnavailable
from impala_league.league.players import learner_players, namespace

log = logging.getLogger("ownership")

LOCK_NAME = "run.lock"
OWNER_ENV = "IMPALA_RUN_OWNER"  # pid of the launcher that holds the run directory's lock
WATCH_EVERY_S = 0.5
# Exit codes of the roles (docs/cluster.md, "Exit codes", has the whole table), for a launcher or a scheduler
# to tell "stop" from "start again". 0: the run is over; 1: an unexpected failure; 128 + N: stopped by
# signal N before the run was over (`stopped_exit_code`).
# An error its one-line message explains (a UserError: a bad config or command line, as argparse's usage
# errors; a taken run name or actor id; a refused password; Redis lost for longer than
# run.redis_retry_s): starting again unchanged is no remedy.
USER_ERROR_EXIT = 2
# `run.py learner` when its collective or rendezvous failed (distributed/learner/data_parallel.py): it is not the
# cause of a failed run but a peer's casualty, so the launcher names the rank that exited otherwise.
PEER_LOST_EXIT = 3
# Redis did not answer at start (within --wait-redis seconds): it may not be up yet, so start again later.
REDIS_UNREACHABLE_EXIT = 4
EXIT_NAMES = {USER_ERROR_EXIT: "an error its message explains", PEER_LOST_EXIT: "a peer learner rank was lost",
              REDIS_UNREACHABLE_EXIT: "Redis unreachable at start"}


def stopped_exit_code(stop_signal: int | None, run_over: Callable[[], bool]) -> int:
    """The exit code of a learner, actor or league manager whose loop has ended (its checkpoint or state
    written): 128 + `stop_signal` when that stop signal (SIGTERM, SIGINT) ended it before the run was over,
    else 0. `run_over()` (the run's done key is set) is asked only after a signal.

    0 means "done" to a scheduler: a Kubernetes Job pod evicted with SIGTERM that exited 0 would be counted
    as succeeded and never replaced, and the run would silently lose it."""
    if stop_signal is None or run_over():
        return 0
    return 128 + stop_signal


def run_role(role, lost_redis: Callable[[Exception], str], run_over: Callable[[], bool],
             failures: tuple[type[Exception], ...] = (), on_failure: Callable[[Exception], str] | None = None) -> int:
    """How a learner, actor or league manager process runs `role.run()` and ends: SIGTERM and SIGINT call
    `role.stop(signum)` (it finishes the current step, writes its checkpoint or state, and keeps the
    signal in `role.stop_signal`); the exit code is then `stopped_exit_code(role.stop_signal, run_over)`.

    A Redis error that outlived the retries becomes RedisUnavailable with the message `lost_redis(e)`
    (which may save what it can first). An exception of `failures` is raised again, of its own type,
    with the message `on_failure(e)` (the same). Raises those two."""
    signal.signal(signal.SIGTERM, role.stop)
    signal.signal(signal.SIGINT, role.stop)
    try:
        role.run()
    except redis.RedisError as e:
        raise RedisUnavailable(lost_redis(e)) from None
    except failures as e:
        raise type(e)(on_failure(e)) from None
    return stopped_exit_code(role.stop_signal, run_over)


class RunDirLocked(UserError, RuntimeError):
    """The run directory is locked by another live process; the message names its host and pid."""


def holder() -> str:
    """This process as a lock or lease holder: 'host pid N'."""
    return f"{socket.gethostname()} pid {os.getpid()}"


def _describe(path: Path) -> str:
    """Who holds the lock at `path`, from what the holder wrote into it."""
    for _ in range(10):  # the holder writes its name just after it takes the lock
        try:
            owner = json.loads(path.read_text())
            return f"{owner['host']} pid {owner['pid']}"
        except (OSError, ValueError, KeyError, TypeError):
            time.sleep(0.05)
    return "another process"


class RunLock:
    """An exclusive flock on `<run_dir>/run.lock`, held until `release()` (or the process ends)."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.file = None

    def acquire(self) -> "RunLock":
        """Take the lock without waiting. Raises RunDirLocked naming the holder if it is taken."""
        f = self.path.open("a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise RunDirLocked(f"{self.run_dir} is in use by a run of {_describe(self.path)}: one process owns a "
                               "run directory; stop that run first (Ctrl-C), or start a new run") from None
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}) + "\n")
        f.flush()
        self.file = f
        return self

    def release(self) -> None:
        if self.file is not None:
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()
            self.file = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_holder(run_dir: str | Path) -> str | None:
    """'host pid N' of the process that holds `run_dir`'s lock, None if nobody does (a listing's look:
    it takes the lock for an instant when it is free)."""
    path = Path(run_dir) / LOCK_NAME
    if not path.is_file():
        return None
    with path.open("r") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _describe(path)
        fcntl.flock(f, fcntl.LOCK_UN)
    return None


def launcher_pid() -> int | None:
    """The pid of the launcher that owns this process's run directory (None: started by hand)."""
    value = os.environ.get(OWNER_ENV)
    return int(value) if value and value.isdigit() else None


def owns_run_dir() -> bool:
    """May this process write into its run directory? A child of `run.py train` may while that launcher
    (which holds the lock) is its parent; a process started by hand relies on its Redis lease."""
    owner = launcher_pid()
    return owner is None or os.getppid() == owner


def exit_with_launcher(label: str) -> None:
    """In a child of `run.py train`: a daemon thread that ends this process within WATCH_EVERY_S of the
    launcher's death, where PR_SET_PDEATHSIG does not exist (not Linux). It writes nothing: the run
    directory is no longer ours."""
    owner = launcher_pid()
    if owner is None:
        return

    def watch() -> None:
        while os.getppid() == owner:
            time.sleep(WATCH_EVERY_S)
        log.error("%s (pid %d): the launcher (pid %d) is gone; stopping without writing into the run directory",
                  label, os.getpid(), owner)
        logging.shutdown()
        os._exit(1)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def new_run_dir(cfg: Config, resume: bool) -> Path:
    """runs/<name>; a fresh run never reuses a directory: it takes <name>-2, <name>-3, ... instead.
    Only picks the path: `claim_run_dir` creates and locks it."""
    base = Path(cfg.run.dir)
    run_dir = base / cfg.run.name
    if resume:
        if not run_dir.is_dir():
            raise ConfigError(f"--resume: no run directory {run_dir}; check run.name and run.dir")
        return run_dir
    k = 2
    name = cfg.run.name
    while (base / name).exists():
        name = f"{cfg.run.name}-{k}"
        k += 1
    cfg.run.name = name
    return base / name


def claim_run_dir(run_dir: Path, resume: bool):
    """Create a fresh run's directory (never an existing one) and lock it (distributed/launch/ownership.py).
    Returns the held RunLock; raises RunDirLocked naming the owner of a live run."""
    if not resume:
        try:
            run_dir.mkdir(parents=True)
        except FileExistsError:
            raise ConfigError(f"{run_dir} was created by someone else while this run started; start it again") from None
        except OSError as e:
            raise ConfigError(f"cannot create the run directory {run_dir}: {e.strerror}; check run.dir") from None
    return RunLock(run_dir).acquire()


def has_checkpoint(run_dir: Path) -> bool:
    """Does any learner of the run directory have a checkpoint to resume from?"""
    return any((run_dir / "checkpoints").rglob("latest.safetensors"))


def check_resumable(cfg: Config, run_dir: Path) -> None:
    """Refuse `--resume` with settings its checkpoint cannot continue under (the network's shape, the env, the
    optimizer), before anything in the run directory is rewritten. Raises ConfigError naming each change."""
    from impala_league.agents.checkpoint import read_checkpoint  # safetensors' torch: only to resume, never at a fresh start

    checkpoint = run_dir / "checkpoints" / "latest.safetensors"
    if not checkpoint.is_file():
        return  # stopped before its first checkpoint: nothing to fit

    def fixed(c: Config) -> dict:
        return {"env.name": c.env.name, "env.kwargs": c.env.kwargs, "learner.optimizer": c.learner.optimizer,
                **{f"agent.{key}": value for key, value in dataclasses.asdict(c.agent).items()}}

    saved, wanted = fixed(from_yaml_text(read_checkpoint(checkpoint)[1]["config"])), fixed(cfg)
    changed = [f"{key}: {saved.get(key)!r} -> {value!r}" for key, value in wanted.items() if saved.get(key) != value]
    if changed:
        raise ConfigError(f"--resume: {checkpoint} was trained with other settings ({'; '.join(changed)}); "
                          f"resume without changing them, or start a new run without --resume. "
                          f"{run_dir / 'config.yaml'} is unchanged")


def write_run_config(run_dir: Path, cfg: Config, where: str) -> None:
    """Create the run directory and its config.yaml (without the Redis URL, which may hold a password)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(to_yaml(without_secrets(cfg)))
    except OSError as e:
        raise ConfigError(f"cannot create the run directory {run_dir}: {e.strerror}; check {where}") from None


@contextlib.contextmanager
def run_lease(client, cfg: Config):
    """On a shared Redis, hold `{run}:launcher` for the run's life, and check that no learner or league
    manager of another launcher (or started by hand) holds this run name, before anything is created or
    started. Raises LeaseHeld naming the holder; a killed run's leases are waited for until they lapse."""
    lease = LearnerLease(client, cfg.run.name, holder(), role="launcher", ttl_s=cfg.run.lease_ttl_s)
    lease.acquire()
    try:
        held_by_others = [keys.lease(namespace(cfg.run.name, p), "learner") for p in learner_players(cfg)]
        held_by_others.append(keys.lease(cfg.run.name, "league"))
        deadline = time.monotonic() + lease.TTL_MS / 1000 + 1
        while (held := [k for k in held_by_others if client.exists(k)]) and time.monotonic() < deadline:
            time.sleep(0.2)
        if held:
            other = (client.get(held[0]) or b"?").decode(errors="replace")
            raise LeaseHeld(f"run '{cfg.run.name}' is live on this Redis: {held[0]} is held by {other}; one owner "
                            "per run: stop that run, or choose another run.name")
        yield
    finally:
        lease.release()
