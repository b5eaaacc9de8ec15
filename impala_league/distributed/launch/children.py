"""The launcher's children, `run.py learner|league|actor` processes, and the rules they live by: started
with the run's Redis URL in their environment (`spawn`), dying with the launcher (`die_with_parent`),
stopped all at once (`stop_all`), and kept running until the run is over (`Workers`). `launcher.py`
supervises a run with these; `embedded_redis.py` starts its redis-server by the same rules.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NamedTuple

import redis

from impala_league import REPO
from impala_league.config import Config
from impala_league.distributed.launch.ownership import EXIT_NAMES, OWNER_ENV, USER_ERROR_EXIT
from impala_league.distributed.launch.restarts import RestartBudget
from impala_league.distributed.wire import keys
from impala_league.distributed.wire.transport import LearnerLease

if TYPE_CHECKING:
    from impala_league.distributed.launch.live import LiveView

log = logging.getLogger("launcher")

REDIS_URL_ENV = "IMPALA_REDIS_URL"


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def stop_signals_held():
    """Hold back SIGINT, SIGTERM and SIGHUP for the block, then deliver them to the handlers of before.

    For a fork (`subprocess.Popen`): Python runs the at-fork hooks of the parent (logging's lock release)
    right after it, and an exception raised there, such as the KeyboardInterrupt of a Ctrl-C that came
    during the fork, is printed as "Exception ignored" and dropped. `run.py train` would then go on
    starting the run as if there had been no Ctrl-C. Only the main thread runs signal handlers: in any
    other thread this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {}
    try:
        for sig in STOP_SIGNALS:
            if signal.getsignal(sig) is not None:  # None: a handler not set from Python, left alone
                previous[sig] = signal.signal(sig, lambda signum, _frame: received.append(signum))
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(received):
            signal.raise_signal(sig)  # e.g. KeyboardInterrupt from signal.default_int_handler, here


def _find_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl  # resolved here: no dlopen between fork and exec
    except (OSError, AttributeError):
        return None


_PRCTL = _find_prctl()
_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """preexec_fn of every child: send it `sig` when the launcher dies, even by SIGKILL (Linux), so that
    no redis-server, learner or actor outlives it. The children are in their own sessions, so
    nothing else would stop them; elsewhere the launcher's own cleanup covers every ordinary exit."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(sig))


def spawn(role: str, config_path: Path | None, redis_url: str, extra: list[str], nice: int = 0,
           view: "LiveView | None" = None) -> subprocess.Popen:
    """Start `run.py role [--config config_path] extra` as a child; with a live view its output goes
    through the view."""
    env = dict(os.environ, **{REDIS_URL_ENV: redis_url, OWNER_ENV: str(os.getpid())}, PYTHONUNBUFFERED="1")
    # The roles share this machine's cores: an OpenMP thread that spins while it waits for work (the
    # default) takes a core from an actor: on 2 cores a learner of learner.num_threads = 2 ran Pong 28%
    # slower than one thread, and 11% faster with passive waiting. The user's own setting wins.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    def setup() -> None:
        # SIGKILL, not SIGTERM: a learner's SIGTERM means "write a final checkpoint", and the run directory
        # is no longer its own once the launcher (which holds its lock) is dead. The signal comes when the
        # launcher's thread that started the child ends, while the rest of the process may still be
        # ending, so a check of the parent could not tell in time (see distributed/launch/ownership.py).
        die_with_parent(signal.SIGKILL)
        if nice:
            os.nice(nice)
            try:  # with autogroup scheduling each session is weighed by its group's niceness instead
                Path("/proc/self/autogroup").write_text(str(nice))
            except OSError:
                pass

    # A new session: Ctrl-C reaches only the launcher, which then stops the children in order.
    output = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} if view is not None else {}
    config = ["--config", str(config_path)] if config_path is not None else []
    proc = subprocess.Popen([sys.executable, str(REPO / "run.py"), role, *config, *extra],
                            env=env, start_new_session=True, preexec_fn=setup, **output)
    if view is not None:
        view.forward(proc.stdout)
    return proc


STOP_TIMEOUT_S = {"actor": 10.0, "other": 60.0}  # SIGTERM to SIGKILL; learners may be writing a checkpoint


def stop_all(procs: dict[str, subprocess.Popen], forced: "Callable[[], bool]") -> None:
    """SIGTERM every process of `procs` at once and wait for them: actors get STOP_TIMEOUT_S["actor"],
    learners and the league manager (which write their files) STOP_TIMEOUT_S["other"], before a SIGKILL.
    Once `forced()` turns true (a second Ctrl-C), whatever is left is killed at once."""
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    start = time.monotonic()
    while True:
        left = {name: p for name, p in procs.items() if p.poll() is None}
        if not left:
            return
        late = [p for name, p in left.items()
                if time.monotonic() - start > STOP_TIMEOUT_S["actor" if name.startswith("actor") else "other"]]
        for proc in left.values() if forced() else late:
            proc.kill()
            proc.wait()
        time.sleep(0.05)


def describe_exit(code: int) -> str:
    """'exited with code 4 (Redis unreachable at start)', 'was killed by SIGKILL': a child's end as Popen saw it."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    name = EXIT_NAMES.get(code)
    return f"exited with code {code}" + (f" ({name})" if name else "")


def _release_dead_actor_id(client: redis.Redis, run: str, role: str, args: list[str], pid: int) -> None:
    """Delete the id lease of actor process `pid` (a `role` child started with `args`), which has been seen
    to exit: left to lapse, it would keep the restarted actor waiting a lease lifetime for its own id
    (`--actor-id N`), or send it to another id. Without --actor-id the run's actor leases are searched for
    the one `pid` of this host held. Nothing for other roles."""
    if role != "actor":
        return
    if "--actor-id" in args:
        leases = [keys.actor_id(run, int(args[args.index("--actor-id") + 1])).encode()]
    else:  # `{run}:actor:{id}`, not the `{run}:actor:{id}:starts` counters
        leases = [key for key in client.scan_iter(match=keys.actor_id(run, "*"), count=1000)
                  if key.rsplit(b":", 1)[1].isdigit()]
    mine = f"{socket.gethostname()} pid {pid} ".encode()
    for key in leases:
        holder = client.get(key)
        if holder is not None and holder.startswith(mine):  # released only if still that holder's
            LearnerLease(client, run, holder.decode(), role=key.decode()[len(run) + 1:]).release()
            return


def _restart_args(role: str, args: list[str]) -> list[str]:
    """A restarted learner or league manager continues from its own files."""
    return args if role == "actor" or "--resume" in args else args + ["--resume"]


def restart_budget(cfg: Config) -> RestartBudget:
    """The supervisors' restart rule from the config: per child, run.max_restarts per run.restart_window_s
    of the crashes within run.crash_loop_s of its start."""
    return RestartBudget(cfg.run.max_restarts, cfg.run.restart_window_s, cfg.run.crash_loop_s)


class Stop(NamedTuple):
    """Why every supervised child must be stopped: the exit code for it and a one-line reason."""

    code: int  # USER_ERROR_EXIT: a child's error that a restart cannot fix; 1: anything else
    reason: str


class Workers:
    """Named `run.py` children kept running until the run is over, with the launcher's rules: the actors,
    exploiter learners and league manager of `supervise`, and the actors of one host (`supervise_actors`).

    commands: name -> (role, extra arguments, niceness), as `worker_commands` makes them; a child is
    `run.py ROLE [--config config_path] ARGS` (`spawn`, which also makes it die with this process).
    A child that exits before the run is over (the run's done key unset), whatever its code, is started
    again, within its own restart budget (`RestartBudget`: only a crash soon after its start counts): an
    actor once its id lease is released (`_release_dead_actor_id`), a learner or league manager with
    --resume (`_restart_args`). A child that exits once the run is over stays ended.
    `poll` says when all must stop instead (`Stop`).
    """

    def __init__(self, commands: dict[str, tuple[str, list[str], int]], config_path: Path | None, redis_url: str,
                 client: redis.Redis, run: str, budget: RestartBudget, view: "LiveView | None" = None) -> None:
        self.commands = dict(commands)
        self.config_path = config_path
        self.redis_url = redis_url
        self.client = client
        self.run = run
        self.view = view
        self.budget = budget  # restarts of each child, per window of time
        self.procs: dict[str, subprocess.Popen] = {}
        self.started: dict[str, float] = {}  # name -> when (the budget's clock) it was last started
        self.ended: set[str] = set()  # names of children that exited once the run was over

    def start(self) -> None:
        """Start every child (`self.procs`: name -> process)."""
        for name, (role, args, nice) in self.commands.items():
            self.procs[name] = spawn(role, self.config_path, self.redis_url, args, nice, self.view)
            self.started[name] = self.budget.clock()

    def alive(self) -> list[str]:
        """The names of the children that are running now."""
        return [name for name, proc in self.procs.items() if proc.poll() is None]

    def poll(self) -> Stop | None:
        """Look at every child once and restart those that exited before the run is over. Returns a Stop
        when every child must be stopped: one exited with USER_ERROR_EXIT (a config or file error, which
        a restart would meet again: code USER_ERROR_EXIT), a child's restart was over its budget (a crash loop),
        or Redis, which says whether the run is over, did not answer (code 1); else None."""
        for name, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None or name in self.ended:
                continue
            try:
                finished = bool(self.client.exists(keys.done(self.run)))
            except redis.RedisError as e:
                return Stop(1, f"lost the connection to Redis: {e}")
            if finished:
                self.ended.add(name)
                log.info("%s (pid %d) %s: the run is over", name, proc.pid, describe_exit(code))
                continue
            if code == USER_ERROR_EXIT:  # a config or file error: restarting won't help
                return Stop(USER_ERROR_EXIT,
                            f"{name} (pid {proc.pid}) failed with an error that a restart cannot fix (see above)")
            if not self.budget.take(name, self.budget.clock() - self.started[name]):
                return Stop(1, f"{name} (pid {proc.pid}) {describe_exit(code)}: {self.budget.describe(name)}; "
                               "giving up on a crash loop (see the errors above)")
            # Redis unreachable at start (an embedded one restarting) is worth a restart too.
            log.warning("%s (pid %d) exited with code %s%s; restarting it", name, proc.pid, code,
                        f" ({EXIT_NAMES[code]})" if code in EXIT_NAMES else "")
            role, args, nice = self.commands[name]
            _release_dead_actor_id(self.client, self.run, role, args, proc.pid)
            self.commands[name] = (role, _restart_args(role, args), nice)
            self.procs[name] = spawn(role, self.config_path, self.redis_url, self.commands[name][1], nice, self.view)
            self.started[name] = self.budget.clock()
            log.info("%s restarted (pid %d)", name, self.procs[name].pid)
        return None
