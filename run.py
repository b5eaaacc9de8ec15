#!/usr/bin/env python
"""IMPALA self-play training: one CLI for every role.

  train     start Redis (embedded unless --redis-url), the learner and the actors, and supervise them
  learner   one learner alone (multi-machine: point it, the league and the actors at one Redis)
  league    the league manager alone (snapshots, payoff, Elo, opponent distributions)
  actor     one actor process
  actors    C actor processes on this host, restarted when they crash, stopped together
  evaluate  play a checkpoint against a baseline bot in both seats, or a round-robin of checkpoints,
            run directories and bots with Elo ratings
  replay    re-simulate a recorded game, check it, and show it (text boards, GIF)
  compare   train several configurations one after another for the same wall clock and seeds
            (IMPALA vs A3C, or the four off-policy corrections) and write a table and plots
  report    one self-contained HTML page about run directories (or a compare output)
  runs      list runs (local run directories; with --redis-url the runs in a shared Redis), and delete
            the Redis keys of a run that is over
  config    print the resolved config of --config and --set

Run `python run.py <role> --help` for the options of a role, and `--help-config` for every config key.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path

from config import Config, ConfigError, UserError, describe, from_yaml_text, to_yaml, without_secrets

log = logging.getLogger("run")

MAX_EVAL_GAMES = 10_000  # games per seat; evaluation steps all of them at once
MAX_WORKERS = 64
MAX_EVAL_HISTORY = 50  # earlier policies played after training; each 1-2 s in connect four at 50 games per seat

EVALUATE_HELP = """Play trained policies and baseline bots against each other.

One checkpoint against one baseline bot, in both seats (win/draw/loss rates per seat):
  run.py evaluate --checkpoint runs/connect_four/checkpoints/latest.safetensors --opponent minimax:2

A round-robin: every pair of players plays --games games in each seat, then a table of win/draw/
loss percentages and Elo ratings (Bradley-Terry maximum likelihood, draws count half, mean rating
0, +- one standard error). A player is a bot (random, tactical, minimax:D with D plies of search),
a .safetensors checkpoint or league snapshot, or a run directory, which stands for its learners'
latest checkpoints and all its league snapshots:
  run.py evaluate --players runs/connect_four tactical minimax:2 --games 50 --workers 2 --json out.json
"""

REPLAY_HELP = """Re-simulate a game saved by `run.py evaluate --record DIR` in the same env version,
kwargs and seed, check every action is legal and that rewards and outcome match the record, and show
it: a text board per move (X moves first) or, in simultaneous-move and one-agent games, a line per
step with units left and reward so far per team; only the last with --final. --gif writes an
animation (simultaneous games: 100 ms per step, every k-th step past 250 steps).
A replay that does not re-simulate to what it records is an error (exit code 2).
"""


COMPARE_HELP = """Train several configurations one after another on this machine, each for the same
wall-clock budget (--minutes) and the same seeds, then compare them.

  --study algos        IMPALA against A3C (learner.algo=impala | a3c), with the config's actor
                       counts for both: the IMPALA paper's Table 1 question (throughput)
  --study corrections  learner.correction = vtrace | is1 | epsilon | none, with the actors acting on
                       weights --lag published versions old (actor.weight_delay): its Table 2;
                       with --replay each correction also with experience replay (variant
                       <correction>-replay: learner.replay_fraction = --replay-fraction, default
                       0.5; the memory is learner.replay_memory_mb, settable with --set)
  --study actors       actor.num_actors = 1, 2, 4, ... up to this machine's cores (--actors to
                       choose): learner-consumed SPS against actors, plotted in sps_vs_actors.png

Every variant x seed is a normal `run.py train` run (without a league) in
OUT/<variant>-seed<seed> with its log beside it. Then OUT gets compare.md and compare.json, one row
per variant (means over seeds; per-seed rows in the JSON). Scores read `mean ± h`: h is the
half-width of the 95% confidence interval of the mean over seeds (Student t, n - 1 degrees of
freedom), "-" with one seed; compare.json has the mean, h (<score>_ci95) and the per-seed values:
  SPS             agent steps per second the learner (A3C: parameter server) trained on, mean
  SPS ratio       the variant's SPS over the first variant's (impala, resp. vtrace)
  frames          agent steps trained on by the end of the budget
  policy lag      learner updates between acting and learning (A3C: gradient staleness)
  final score     the score at the end of the run
  final score vs bot
                  two-player games: the final checkpoint, greedy, against --eval-opponent in both
                  seats (wins + draws / 2); self-play returns measure nothing there
  score at equal wall clock / at equal frames
                  the score when the shortest run ended, resp. at the fewest frames any run reached
and curves_wall_clock.png, curves_frames.png (the score of every run against both axes).
The score is the metric --metric of metrics.jsonl, by default league_score where recorded, else
episode_return (the learning seat's return: the score of single-agent envs such as gym:CartPole-v1;
~0 in two-player self-play). `run.py report OUT` shows it all on one page.

  run.py compare --config configs/tictactoe.yaml --minutes 10 --seeds 0 1 2
  run.py compare --config configs/cartpole.yaml --study corrections --lag 20 --minutes 5 --seeds 0 1 2
  run.py compare --config configs/cartpole.yaml --study corrections --replay --lag 20 --minutes 1 --seeds 0 1 2 3 4
"""


ACTORS_HELP = """Run the actors of one host: C `run.py actor` processes (default: one per CPU of this
host), each with this command's --config, --set, --player and --wait-redis, each taking the lowest free
actor id of the run. The Redis URL reaches them through the environment, never their command line.

  run.py actors --config configs/connect_four.yaml --redis-url redis://:PASSWORD@HOST:6379/0 --count 16

It supervises them as `run.py train` does its own: a line per actor started, restarted or ended, with
its pid. An actor that crashes is started again (its id released first), up to 20 restarts in all,
then every actor is stopped (exit code 1). An actor that exits with code 2 (a config error) stops them
all (2). When the run is over (the learner set its done key) the actors end and so does this (0).
SIGTERM, SIGINT or SIGHUP sends every actor SIGTERM, kills those left after 10 s (at once on a second
signal), and exits with 128 + the signal's number. If this process is killed, its actors die with it.
"""


RUNS_HELP = """List runs, or delete what a run left in a shared Redis.

  run.py runs                                   the run directories under runs/ (--dir): live (host and
                                                pid of its owner), finished or stopped, frames, env
  run.py runs --redis-url URL                   also the run names that have keys in that Redis: live or
                                                not, finished or not, keys and bytes
  run.py runs --redis-url URL --delete NAME     delete every key of run NAME (refused while it is live)
"""


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML experiment config (see configs/)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config value, e.g. --set learner.batch_size=64 (repeatable)")
    p.add_argument("--redis-url", help="redis://[:password@]host:port/db of a shared Redis "
                   "(default: run.redis_url, else $IMPALA_REDIS_URL, else an embedded Redis for train)")
    p.add_argument("--help-config", action="store_true", help="list every config key with its default and doc")


def _seconds(text: str) -> float:
    """argparse type: a finite number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def _wait_redis_arg(p: argparse.ArgumentParser, what: str = "Redis") -> None:
    p.add_argument("--wait-redis", type=_seconds, default=0.0, metavar="SECONDS",
                   help=f"at start, wait up to SECONDS for {what} to answer (default 0: try once); past that, "
                   "exit with code 4, which means: start again later (e.g. Redis starts after this process)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="role", required=True)
    p = sub.add_parser("train", help="run a whole training job on this machine")
    _config_args(p)
    p.add_argument("--resume", nargs="?", const=True, metavar="RUN_DIR",
                   help="continue the run in RUN_DIR from its checkpoint, with RUN_DIR/config.yaml as the config "
                   "(--set changes values; the network, env and optimizer must stay); without RUN_DIR, continue "
                   "<run.dir>/<run.name> of --config")
    p.add_argument("--eval-games", type=int, default=200,
                   help="games per seat against each baseline bot after training (default 200; 0 = skip)")
    p.add_argument("--eval-history", type=int, default=6, metavar="N",
                   help="games of several seats: also play up to N earlier policies of the run (a league's main "
                   "snapshots, else checkpoints/history/) against the same bots after training, to see how it "
                   "learned (default 6; 0 = none)")
    p.add_argument("--eval-history-games", type=int, default=50, metavar="G",
                   help="games per seat and bot of each earlier policy (default 50)")
    _wait_redis_arg(p, "a shared Redis (--redis-url) and the trajectory shards' servers")
    p = sub.add_parser("learner", help="run the learner against a Redis")
    _config_args(p)
    _wait_redis_arg(p, "Redis and the trajectory shards' servers")
    p.add_argument("--run-dir", help="run directory (default: <run.dir>/<run.name>)")
    p.add_argument("--resume", action="store_true", help="continue from <run-dir>/checkpoints/latest.safetensors")
    p.add_argument("--player", default="main", help="which learner: main (default), main_exploiter_N or "
                   "league_exploiter_N (see league.* in --help-config)")
    p.add_argument("--rank", type=int, default=0, help="with learner.num_learners=K: this learner's rank, 0..K-1 "
                   "(0 publishes weights and writes checkpoints and metrics)")
    p.add_argument("--dist-url", help="with learner.num_learners=K: the rendezvous of the K learners, "
                   "tcp://<rank 0's host>:<free port>, the same for every rank")
    p = sub.add_parser("league", help="run the league manager against a Redis")
    _config_args(p)
    _wait_redis_arg(p)
    p.add_argument("--run-dir", help="run directory (default: <run.dir>/<run.name>)")
    p.add_argument("--resume", action="store_true", help="continue from <run-dir>/league/state.json")
    p = sub.add_parser("actor", help="run one actor process against a Redis")
    _config_args(p)
    _wait_redis_arg(p, "Redis and the trajectory shards' servers")
    p.add_argument("--actor-id", type=int, default=None,
                   help="this actor's id in the run (refused if a live actor holds it); default: the lowest free id")
    p.add_argument("--player", default="main", help="the learner this actor plays for (default main)")
    p = sub.add_parser("actors", help="run and supervise C actor processes on this host",
                       description=ACTORS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    _config_args(p)
    _wait_redis_arg(p, "Redis and the trajectory shards' servers (each actor waits as long)")
    p.add_argument("--count", type=int, default=os.cpu_count() or 1, metavar="C",
                   help=f"actor processes to run (default: this host's CPU count, {os.cpu_count() or 1})")
    p.add_argument("--player", default="main", help="the learner these actors play for (default main)")
    p = sub.add_parser("evaluate", help="play a checkpoint against a baseline bot, or a round-robin with Elo",
                       description=EVALUATE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--checkpoint", help="a learner checkpoint (runs/<name>/checkpoints/latest.safetensors) "
                     "to play against --opponent in both seats")
    who.add_argument("--players", nargs="+", metavar="SPEC",
                     help="round-robin between these players: bots (random, tactical, minimax:D), "
                     ".safetensors checkpoints, and run directories (their latest checkpoints and league snapshots)")
    p.add_argument("--opponent", help="with --checkpoint: baseline bot random, tactical or minimax:D (default random)")
    p.add_argument("--env", help="with --players: the game (connect_four, tictactoe); needed only when all "
                   "players are bots, else taken from the checkpoints")
    p.add_argument("--games", type=int, default=200, help="games per seat (per pair and seat with --players; "
                   "default 200)")
    p.add_argument("--seed", type=int, default=0, help="seed of the games and the bots")
    p.add_argument("--sample", action="store_true", help="sample from the policies instead of playing greedily "
                   "(two greedy policies play the same game every time)")
    p.add_argument("--workers", type=int, default=1, help="with --players: pairs played at once, each in its own "
                   "process (default 1: all in this process)")
    p.add_argument("--json", "--out", dest="json", nargs="?", const="-", metavar="FILE",
                   help="write the results as JSON to FILE (with --players: every match and the ratings); "
                   "without FILE, or with -, print the JSON instead of the table")
    p.add_argument("--record", metavar="DIR", help="save every game as a JSON replay in DIR "
                   "(<seat 0>-vs-<seat 1>-<game>.json; see `run.py replay`)")
    p = sub.add_parser("replay", help="re-simulate a recorded game, check it, and show it",
                       description=REPLAY_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="a replay written by `run.py evaluate --record DIR`")
    p.add_argument("--final", action="store_true", help="print only the final board (or step) instead of one per move")
    p.add_argument("--gif", metavar="OUT.gif", help="also write an animated GIF of the env's own rendering, "
                   "one frame for the start and one per move or step")
    p = sub.add_parser("compare", help="train several configurations for the same wall clock and compare them",
                       description=COMPARE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    _config_args(p)
    p.add_argument("--study", default="algos", help="algos (IMPALA vs A3C, default), corrections or actors")
    p.add_argument("--actors", type=int, nargs="+", help="actors study: the actor counts (default 1, 2, 4, ... "
                   "up to the cores)")
    p.add_argument("--minutes", type=float, default=10.0, help="wall-clock budget of each run (default 10)")
    p.add_argument("--frames", type=int, help="also end each run at this many agent steps trained (default: only the budget)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds; every variant runs each (default 0 1 2)")
    p.add_argument("--variants", nargs="+", help="run only these variants of the study (e.g. vtrace is1); "
                   "default: all")
    p.add_argument("--lag", type=int, default=20, help="corrections study: actor.weight_delay, in published "
                   "versions (default 20)")
    p.add_argument("--replay", action="store_true", help="corrections study: also run each correction with "
                   "experience replay (variants <correction>-replay), as in the second half of IMPALA's Table 2")
    p.add_argument("--replay-fraction", type=float, help="with --replay: learner.replay_fraction of the replay "
                   "variants, the share of each batch drawn from replayed unrolls (default 0.5)")
    p.add_argument("--metric", default="auto", help="metrics.jsonl key used as the score (default auto: "
                   "league_score, else episode_return)")
    p.add_argument("--out", help="output folder (default <run.dir>/compare-<study>-<date>-<time>); must not exist")
    p.add_argument("--eval-opponent", help="multi-seat games: the bot each final checkpoint plays for the 'final "
                   "score vs bot' column (random, tactical, minimax:D; default: tactical where the game has it, "
                   "else random)")
    p.add_argument("--eval-games", type=int, default=100, help="games per seat of that evaluation (0 = none)")
    p = sub.add_parser("report", help="one self-contained HTML page about run directories and compare outputs",
                       description="Write one HTML file (plots embedded as PNG) about each RUN_DIR: the architecture "
                       "with the run's SPS, queue depth, policy lag and publish rate; learning curves; throughput; "
                       "the policy-lag histogram; V-trace diagnostics; league Elo and payoff where a league ran. "
                       "A `run.py compare` output folder adds its table and curves, then each of its runs.")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories and/or compare output folders")
    p.add_argument("--out", help="HTML file to write (default: RUN_DIR/report.html of the first one)")
    p = sub.add_parser("runs", help="list runs, or delete the Redis keys of a run that is over",
                       description=RUNS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default="runs", help="the folder of run directories to list (default: runs)")
    p.add_argument("--redis-url", help="also list the runs whose keys are in this shared Redis "
                   "(default: $IMPALA_REDIS_URL)")
    p.add_argument("--delete", metavar="RUN_NAME", help="delete every key of run RUN_NAME from --redis-url; "
                   "refused while the run is live (a launcher, learner or league manager holds its lease)")
    _wait_redis_arg(p, "the Redis of --redis-url")
    p = sub.add_parser("config", help="print the resolved config of --config and --set (YAML, no secrets)")
    _config_args(p)
    return parser


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        stream=sys.stdout)


def _load(args: argparse.Namespace) -> Config:
    if args.help_config:
        print(describe())
        sys.exit(0)
    from experiment import load_config

    return load_config(args.config, args.overrides)


def _require_game(cfg: Config) -> None:
    """StarCraft II runs stop here, before any actor starts, when the game is not installed."""
    if cfg.env.name.startswith("sc2:"):
        from envs.sc2_wrappers.compat import SC2NotInstalledError
        from envs.sc2_wrappers.env import check_game_installed

        try:
            check_game_installed(cfg.env.name, cfg.env.kwargs)
        except SC2NotInstalledError as e:
            raise ConfigError(str(e)) from None


def _redis_url(args: argparse.Namespace, cfg: Config) -> str | None:
    from distributed.launcher import REDIS_URL_ENV

    return args.redis_url or cfg.run.redis_url or os.environ.get(REDIS_URL_ENV)


def _connect_waiting(args: argparse.Namespace, cfg: Config, url: str, shards: bool = False):
    """A client of the run's Redis at `url` once it answers PING and, with `shards`, once every other
    server of the trajectory shards (transport.shard_urls) does too: waiting up to --wait-redis seconds
    in all. Raises RedisUnreachable past that (exit code 4); a bad URL or password fails at once (2)."""
    import time

    from distributed.transport import connect, shard_urls

    deadline = time.monotonic() + args.wait_redis
    client = connect(url, wait_s=args.wait_redis)
    if shards:
        for server in dict.fromkeys(shard_urls(url, cfg.transport.shards, cfg.transport.shard_urls)):
            if server != url:
                connect(server, wait_s=max(0.0, deadline - time.monotonic())).close()
    return client


def _new_run_dir(cfg: Config, resume: bool) -> Path:
    """runs/<name>; a fresh run never reuses a directory: it takes <name>-2, <name>-3, ... instead.
    Only picks the path: `_claim_run_dir` creates and locks it."""
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


def _train_config(args: argparse.Namespace) -> Config:
    """`train`'s config: --config + --set, or with `--resume RUN_DIR` that run's own config.yaml + --set
    (run.dir and run.name then come from RUN_DIR)."""
    if not isinstance(args.resume, str):
        return _load(args)
    if args.help_config:
        return _load(args)
    run_dir = Path(args.resume)
    if args.config:
        raise ConfigError("--resume RUN_DIR reads RUN_DIR/config.yaml: drop --config (change values with --set), "
                          "or use --config with a bare --resume")
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"--resume {run_dir}: no config.yaml there; is it a run directory?")
    from experiment import load_config

    cfg = load_config(run_dir / "config.yaml", args.overrides)
    cfg.run.dir, cfg.run.name = str(run_dir.parent), run_dir.name
    return cfg


@contextlib.contextmanager
def _run_lease(client, cfg: Config):
    """On a shared Redis, hold `{run}:launcher` for the run's life, and check that no learner or league
    manager of another launcher (or started by hand) holds this run name, before anything is created or
    started. Raises LeaseHeld naming the holder; a killed run's leases are waited for until they lapse."""
    import time

    from distributed.ownership import holder
    from distributed.transport import LearnerLease, LeaseHeld
    from league.players import learner_players, namespace

    lease = LearnerLease(client, cfg.run.name, holder(), role="launcher", ttl_s=cfg.run.lease_ttl_s)
    lease.acquire()
    try:
        keys = [f"{namespace(cfg.run.name, p)}:learner" for p in learner_players(cfg)] + [f"{cfg.run.name}:league"]
        deadline = time.monotonic() + lease.TTL_MS / 1000 + 1
        while (held := [k for k in keys if client.exists(k)]) and time.monotonic() < deadline:
            time.sleep(0.2)
        if held:
            other = (client.get(held[0]) or b"?").decode(errors="replace")
            raise LeaseHeld(f"run '{cfg.run.name}' is live on this Redis: {held[0]} is held by {other}; one owner "
                            "per run: stop that run, or choose another run.name")
        yield
    finally:
        lease.release()


def _check_learner_gpus(cfg: Config, device) -> None:
    """`run.py train` starts its K learners on this machine: on CUDA each needs a GPU of its own (NCCL
    refuses two ranks on one GPU). Raises ConfigError."""
    import torch

    learners = cfg.learner.num_learners
    if learners == 1 or device.type != "cuda":
        return
    if device.index is not None:
        raise ConfigError(f"learner.num_learners={learners} on one machine takes one GPU per learner: set "
                          f"learner.device=cuda (learner rank r takes GPU r), not {cfg.learner.device}")
    if learners > torch.cuda.device_count():
        raise ConfigError(f"learner.num_learners={learners} needs one GPU per learner and this machine has "
                          f"{torch.cuda.device_count()}: lower it, or set learner.device=cpu")


def _claim_run_dir(run_dir: Path, resume: bool):
    """Create a fresh run's directory (never an existing one) and lock it (distributed/ownership.py).
    Returns the held RunLock; raises RunDirLocked naming the owner of a live run."""
    from distributed.ownership import RunLock

    if not resume:
        try:
            run_dir.mkdir(parents=True)
        except FileExistsError:
            raise ConfigError(f"{run_dir} was created by someone else while this run started; start it again") from None
        except OSError as e:
            raise ConfigError(f"cannot create the run directory {run_dir}: {e.strerror}; check run.dir") from None
    return RunLock(run_dir).acquire()


def _has_checkpoint(run_dir: Path) -> bool:
    return any((run_dir / "checkpoints").rglob("latest.safetensors"))


def _check_resumable(cfg: Config, run_dir: Path) -> None:
    """Refuse `--resume` with settings its checkpoint cannot continue under (the network's shape, the env, the
    optimizer), before anything in the run directory is rewritten. Raises ConfigError naming each change."""
    from agents.checkpoint import read_checkpoint

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


def _write_run_config(run_dir: Path, cfg: Config, where: str) -> None:
    """Create the run directory and its config.yaml (without the Redis URL, which may hold a password)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(to_yaml(without_secrets(cfg)))
    except OSError as e:
        raise ConfigError(f"cannot create the run directory {run_dir}: {e.strerror}; check {where}") from None


def cmd_train(args: argparse.Namespace) -> int:
    import signal

    # Until the launcher takes over: a SIGTERM or a closed terminal (SIGHUP) stops start-up as Ctrl-C does.
    # SIGINT too: a shell starts a background job with it ignored, which Python keeps, and the launcher
    # answers it once it supervises; start-up must not be the one window where it does nothing.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)
    resume = args.resume is not None
    cfg = _train_config(args)
    _require_game(cfg)
    if args.eval_games > MAX_EVAL_GAMES:
        raise ConfigError(f"--eval-games must be <= {MAX_EVAL_GAMES}")
    if not 0 <= args.eval_history <= MAX_EVAL_HISTORY:
        raise ConfigError(f"--eval-history must be in [0, {MAX_EVAL_HISTORY}]")
    if not 1 <= args.eval_history_games <= MAX_EVAL_GAMES:
        raise ConfigError(f"--eval-history-games must be in [1, {MAX_EVAL_GAMES}]")
    url = _redis_url(args, cfg)
    client = _connect_waiting(args, cfg, url, shards=True) if url else None  # fail fast with a clear message
    if cfg.learner.device != "auto" or cfg.learner.num_learners > 1:  # auto alone cannot fail (nor needs torch)
        from distributed.learner import pick_device

        device = pick_device(cfg.learner.device)  # fail fast: e.g. learner.device=cuda on a machine without CUDA
        _check_learner_gpus(cfg, device)
    run_dir = _new_run_dir(cfg, resume)
    with _run_lease(client, cfg) if client is not None else contextlib.nullcontext():  # before anything is made
        lock = _claim_run_dir(run_dir, resume)
        code = None
        try:
            code, finished = _train(args, cfg, run_dir, url, resume)
        finally:
            if not resume and (code is None or code >= 128) and not _has_checkpoint(run_dir):
                # Nothing to resume: a directory left here would only push the next run to <name>-2.
                import shutil

                shutil.rmtree(run_dir, ignore_errors=True)
                log.info("removed %s: the run stopped before its first checkpoint", run_dir)
            lock.release()
    checkpoint = run_dir / "checkpoints" / "latest.safetensors"
    if finished and code >= 128:
        log.info("the run reached its end (the signal came while its learner was closing); no final evaluation: "
                 "`run.py evaluate --checkpoint %s` plays it", checkpoint)
    elif not finished and _has_checkpoint(run_dir) and code in (0, *range(128, 160)):
        log.info("stopped before the end of the run; `run.py train --resume %s` continues it", run_dir)
    if finished and code == 0 and checkpoint.exists() and args.eval_games > 0:
        if cfg.env.name.startswith("sc2:"):
            log.info("StarCraft II: no baseline-bot evaluation after training (the bots play Discrete actions); "
                     "checkpoint: %s", checkpoint)
        else:
            _final_evaluation(cfg, checkpoint, args.eval_games, run_dir, args.eval_history, args.eval_history_games)
    return code


def _train(args: argparse.Namespace, cfg: Config, run_dir: Path, url: str | None, resume: bool) -> tuple[int, bool]:
    """The run itself, in its locked directory: config file, Redis, supervision. Returns supervise's
    (exit code, finished)."""
    from distributed.launcher import EmbeddedRedis, supervise

    if resume:
        if not _has_checkpoint(run_dir):  # checked once the directory is ours: a live run has none yet
            raise ConfigError(f"--resume: no checkpoint under {run_dir}: the run stopped before its first one; "
                              "start it again without --resume")
        _check_resumable(cfg, run_dir)
    config_path = run_dir / "config.yaml"
    _write_run_config(run_dir, cfg, "run.dir")  # children get the URL from the environment
    log.info("run %s: %s, %d actors x %d envs; run directory %s", cfg.run.name, cfg.env.name,
             cfg.actor.num_actors, cfg.actor.num_envs, run_dir)
    view = None
    if sys.stdout.isatty():  # a live progress view on a terminal; plain log lines otherwise
        from distributed.live import LiveView

        view = LiveView(cfg, run_dir / "metrics.jsonl")
    with view or contextlib.nullcontext():
        if url:
            return supervise(cfg, config_path, run_dir, url, resume, view)
        with EmbeddedRedis(run_dir / "redis", restart_on_exit=True) as server:  # its AOF lives in the run dir
            log.info("embedded redis-server on 127.0.0.1:%d (password protected)", server.port)
            return supervise(cfg, config_path, run_dir, server.url, resume, view)


def _final_evaluation(cfg: Config, checkpoint: Path, games: int, run_dir: Path, history: int = 0,
                      history_games: int = 50) -> None:
    """Play the final checkpoint greedily against the baseline bots (one-agent envs: episodes alone),
    log the results and keep them in RUN_DIR/evaluation.json (`record_final_evaluation`). Games of several
    seats with `history` > 0: also up to `history` earlier policies, `history_games` per seat, against the
    bots the final policy played (`_over_training`)."""
    from agents.policy import load_policy
    from evaluation.evaluate import episode_returns, evaluate

    policy = load_policy(checkpoint)
    record = {**_checkpoint_facts(checkpoint), "seed": 0, "games": games}
    if len(policy.spec.seats) == 1:
        r = episode_returns(policy, games)
        record["episodes"] = r
        log.info("greedy policy over %d episodes: mean return %.3g (std %.3g, min %.3g, max %.3g)", games,
                 r["mean_return"], r["std_return"], r["min_return"], r["max_return"])
        log.info("checkpoint: %s  (python run.py evaluate --checkpoint %s)", checkpoint, checkpoint)
        record_final_evaluation(cfg, run_dir, record)
        return
    strongest = {"connect_four": "minimax:2", "tictactoe": "minimax:9"}  # the search depths shown in README
    board = policy.spec.name in strongest
    record["opponents"] = {}
    for opponent in ("random", "tactical", strongest[policy.spec.name]) if board else ("random",):
        result = evaluate(policy, opponent, games)
        record["opponents"][opponent] = result["seats"]
        log.info("greedy policy vs %s over %d games per seat:", opponent, games)
        for seat, r in result["seats"].items():
            log.info("  %s", _seat_line(seat, r))
    log.info("checkpoint: %s  (python run.py evaluate --checkpoint %s --opponent %s)", checkpoint, checkpoint,
             "tactical" if board else "random")
    if history > 0:
        opponents = ("tactical", strongest[policy.spec.name]) if board else ("random",)
        record["over_training"] = _over_training(cfg, run_dir, record, opponents, history, history_games)
    record_final_evaluation(cfg, run_dir, record)


def _over_training(cfg: Config, run_dir: Path, record: dict, opponents: tuple[str, ...], count: int,
                   games: int) -> list[dict]:
    """Up to `count` earlier policies of the run (a league's snapshots of the main agent, else the copies in
    checkpoints/history/) against `opponents`, `games` per seat (evaluation/over_training.py), then the
    final checkpoint's results from `record`: the list kept as `over_training` in evaluation.json."""
    import time

    from distributed.history import history_files
    from evaluation.over_training import earlier_policies, evaluate_over_training
    from league.players import MAIN, checkpoint_dir

    if cfg.league.enabled:
        candidates = sorted((run_dir / "league" / "snapshots").glob(f"{MAIN}-*.safetensors"))
    else:
        candidates = history_files(checkpoint_dir(run_dir, MAIN))
    start = time.monotonic()
    entries = evaluate_over_training(earlier_policies(candidates, record["step"], count), opponents, games)
    final = {"checkpoint": record["checkpoint"], "step": record["step"], "frames": record["frames"],
             "games": record["games"], "opponents": {o: record["opponents"][o] for o in opponents}}
    if entries:
        log.info("over training: %d earlier policies, %d games per seat and bot, in %.1f s (first / second seat):",
                 len(entries), games, time.monotonic() - start)
    else:
        log.info("over training: no earlier policy of this run to play (%s)", "no snapshot of the main agent"
                 if cfg.league.enabled else "no copy in checkpoints/history/")
    for entry in entries + [final]:
        for opponent, seats in entry["opponents"].items():
            log.info("  update %s%s, %s frames, vs %s: %s", entry["step"], " (final)" if entry is final else "",
                     f"{entry['frames'] or 0:,}", opponent, _seats_summary(seats))
    return entries + [final]


def _seats_summary(seats: dict) -> str:
    """'won 90% / 80%, took 70% / 65% of immediate wins, made 50% / 55% of forced blocks' over the seats
    of one match (`MatchResult.as_dict()` per seat; '-' where a seat had no chance); in games without
    one-move tactics 'won 90% / 80%, mean return +12.5 / +9.0'."""
    def rates(key: str) -> str:
        return " / ".join("-" if r["tactics"][key] is None else f"{r['tactics'][key]:.0%}" for r in seats.values())

    won = " / ".join(f"{r['win_rate']:.0%}" for r in seats.values())
    if any(r.get("tactics") is None for r in seats.values()):
        return f"won {won}, mean return " + " / ".join(f"{r.get('mean_return', 0.0):+.1f}" for r in seats.values())
    return f"won {won}, took {rates('wins_taken_rate')} of immediate wins, made {rates('blocks_made_rate')} of forced blocks"


def record_final_evaluation(cfg: Config, run_dir: Path, record: dict) -> None:
    """The one place the final evaluation of `train` is kept: RUN_DIR/evaluation.json (shown by
    `run.py report`), and its numbers in the run's trackers (wandb, TensorBoard) as
    `final_evaluation/<opponent>/<seat>/<rate>` (one-agent envs: `final_evaluation/episodes/<stat>`)."""
    from analysis.runs import EVALUATION_FILE
    from tracking import log_final_evaluation

    (run_dir / EVALUATION_FILE).write_text(json.dumps(record, indent=2) + "\n")
    log.info("final evaluation saved to %s", run_dir / EVALUATION_FILE)
    results = {"episodes": record["episodes"]} if "episodes" in record else record.get("opponents", {})
    log_final_evaluation(cfg, run_dir, _flat(results), step=record.get("step"))


def _flat(tree: dict, prefix: str = "") -> dict[str, float]:
    """{"a": {"b": 1}} -> {"a/b": 1}: the numbers of a nested dict under slash-joined keys."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"{prefix}{key}"] = value
    return out


def _checkpoint_facts(checkpoint: str | Path) -> dict:
    """The checkpoint's path, update step and frames (from its metadata; None where it has none)."""
    from agents.checkpoint import read_checkpoint

    meta = json.loads(read_checkpoint(checkpoint)[1]["meta"])
    return {"checkpoint": str(checkpoint), "step": meta.get("step"), "frames": meta.get("frames")}


def cmd_learner(args: argparse.Namespace) -> int:
    from distributed.learner import run_learner
    from distributed.ownership import exit_with_launcher

    exit_with_launcher("learner")
    cfg = _load(args)
    if cfg.learner.num_learners == 1 and (args.rank or args.dist_url):
        raise ConfigError("--rank and --dist-url are for several learners: set learner.num_learners")
    if not 0 <= args.rank < cfg.learner.num_learners:
        raise ConfigError(f"--rank {args.rank} is not in [0, {cfg.learner.num_learners}) "
                          f"(learner.num_learners={cfg.learner.num_learners})")
    url = _redis_url(args, cfg)
    if not url:
        raise ConfigError("the learner needs a Redis: pass --redis-url or set run.redis_url")
    _connect_waiting(args, cfg, url, shards=True).close()  # fail fast, before anything is written
    player = _player(args, cfg)
    run_dir = Path(args.run_dir) if args.run_dir else Path(cfg.run.dir) / cfg.run.name
    if not (run_dir / "config.yaml").exists():
        _write_run_config(run_dir, cfg, "--run-dir or run.dir")
    from analysis.report import log_report  # the end-of-run figures; the learner imports no report code
    from distributed.data_parallel import DataParallelError
    from distributed.ownership import PEER_LOST_EXIT

    try:
        if cfg.learner.algo == "a3c":
            from distributed.a3c import ParameterServer

            return run_learner(cfg, url, run_dir, resume=args.resume, player=player, learner_class=ParameterServer,
                               report=log_report)
        return run_learner(cfg, url, run_dir, resume=args.resume, player=player, report=log_report,
                           rank=args.rank, dist_url=args.dist_url)
    except DataParallelError as e:
        print(f"error: {e}", file=sys.stderr)
        return PEER_LOST_EXIT


def _player(args: argparse.Namespace, cfg: Config) -> str:
    """The --player id, checked against the learners this config has."""
    from league.players import learner_players

    players = learner_players(cfg)
    if args.player not in players:
        raise ConfigError(f"--player {args.player!r} is not a learner of this config; it has: {', '.join(players)} "
                          "(exploiters need league.enabled=true and league.main_exploiters / league.league_exploiters)")
    return args.player


def cmd_league(args: argparse.Namespace) -> int:
    from distributed.ownership import exit_with_launcher
    from league.manager import run_league

    exit_with_launcher("league manager")
    cfg = _load(args)
    if not cfg.league.enabled:
        raise ConfigError("the league manager needs league.enabled=true")
    url = _redis_url(args, cfg)
    if not url:
        raise ConfigError("the league manager needs a Redis: pass --redis-url or set run.redis_url")
    _connect_waiting(args, cfg, url).close()
    run_dir = Path(args.run_dir) if args.run_dir else Path(cfg.run.dir) / cfg.run.name
    return run_league(cfg, url, run_dir, resume=args.resume)


def cmd_actor(args: argparse.Namespace) -> int:
    from distributed.actor import run_actor
    from distributed.ownership import exit_with_launcher

    exit_with_launcher(f"actor {args.actor_id}")
    cfg = _load(args)
    _require_game(cfg)
    if args.actor_id is not None and args.actor_id < 0:
        raise ConfigError("--actor-id must be >= 0")
    url = _redis_url(args, cfg)
    if not url:
        raise ConfigError("the actor needs a Redis: pass --redis-url or set run.redis_url")
    player = _player(args, cfg)
    _connect_waiting(args, cfg, url, shards=True).close()
    if cfg.learner.algo == "a3c":
        from distributed.a3c import A3CWorker

        return run_actor(cfg, url, args.actor_id, player, actor_class=A3CWorker)
    return run_actor(cfg, url, args.actor_id, player)


def cmd_actors(args: argparse.Namespace) -> int:
    from distributed.launcher import supervise_actors

    cfg = _load(args)
    _require_game(cfg)
    if args.count < 1:
        raise ConfigError(f"--count must be >= 1 (actor processes on this host), got {args.count}")
    url = _redis_url(args, cfg)
    if not url:
        raise ConfigError("the actors need a Redis: pass --redis-url or set run.redis_url")
    player = _player(args, cfg)
    _connect_waiting(args, cfg, url, shards=True).close()
    return supervise_actors(cfg, args.config, args.overrides, url, args.count, player, args.wait_redis)


def _check_evaluate_args(args: argparse.Namespace) -> None:
    if not 1 <= args.games <= MAX_EVAL_GAMES:
        raise ConfigError(f"--games must be in [1, {MAX_EVAL_GAMES}]")  # every game is a live env at once
    if not 0 <= args.seed < 2**31:
        raise ConfigError("--seed must be in [0, 2**31)")
    if args.players is not None:
        if args.opponent is not None:
            raise ConfigError("--opponent goes with --checkpoint; with --players list the bot among the players")
        if not 1 <= args.workers <= MAX_WORKERS:
            raise ConfigError(f"--workers must be in [1, {MAX_WORKERS}]")
    else:
        if args.env is not None:
            raise ConfigError("--env goes with --players; a checkpoint names its own env")
        if args.workers != 1:
            raise ConfigError("--workers goes with --players")
    if args.record:
        try:
            Path(args.record).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"--record: cannot create the directory {args.record}: {e.strerror}") from None


def _emit_json(result: dict, target: str) -> None:
    """Print `result` (target "-") or write it to the file `target`."""
    text = json.dumps(result, indent=2)
    if target == "-":
        print(text)
        return
    try:
        Path(target).write_text(text + "\n")
    except OSError as e:
        raise ConfigError(f"--json: cannot write {target}: {e.strerror}") from None


def cmd_evaluate(args: argparse.Namespace) -> int:
    _check_evaluate_args(args)
    if args.players is not None:
        return _tournament(args)
    from agents.policy import load_policy
    from evaluation.bots import make_bot
    from evaluation.evaluate import episode_returns, evaluate
    from evaluation.tournament import checkpoint_player

    opponent = args.opponent or "random"
    policy = load_policy(args.checkpoint, seed=args.seed)
    name = checkpoint_player(Path(args.checkpoint), args.checkpoint).name if args.record else "checkpoint"
    if len(policy.spec.seats) == 1:
        result = episode_returns(policy, args.games, seed=args.seed, greedy=not args.sample,
                                 record_dir=args.record, name=name)
        result.update(_checkpoint_facts(args.checkpoint), seed=args.seed)
        if args.json:
            _emit_json(result, args.json)
        if args.json != "-":
            print(f"{result['env']}: {args.games} episodes, mean return {result['mean_return']:.1f} "
                  f"(std {result['std_return']:.1f}, min {result['min_return']:.1f}, max {result['max_return']:.1f})")
        return 0
    try:
        make_bot(opponent, policy.spec.name)
    except ValueError as e:
        raise ConfigError(f"--opponent: {e}") from None
    result = evaluate(policy, opponent, args.games, seed=args.seed, greedy=not args.sample,
                      record_dir=args.record, name=name)
    result.update(_checkpoint_facts(args.checkpoint), seed=args.seed)
    if args.json:
        _emit_json(result, args.json)
    if args.json != "-":
        print(f"{result['env']}: checkpoint vs {opponent}, {args.games} games per seat")
        for seat, r in result["seats"].items():
            print(f"  {_seat_line(seat, r)}")
    return 0


def _seat_line(seat: str, result: dict) -> str:
    """'as player_0: won 95.0%  drew 1.0%  lost 4.0%  mean return +0.9' and the seat's tactics
    (`_tactics_line`), for one seat's `MatchResult.as_dict()`."""
    mean_return = f"  mean return {result['mean_return']:+.1f}" if "mean_return" in result else ""
    return (f"as {seat}: won {result['win_rate']:.1%}  drew {result['draw_rate']:.1%}  lost {result['loss_rate']:.1%}"
            + mean_return + _tactics_line(result["tactics"]))


def _tactics_line(tactics: dict | None) -> str:
    """'; took 30/40 immediate wins (75%), made 9/12 forced blocks (75%)' (evaluation/tactics.py; no rate
    where there was no chance); '' for games without a board model."""
    if tactics is None:
        return ""

    def part(done: int, chances: int, what: str) -> str:
        return f"{done}/{chances} {what}" + (f" ({done / chances:.0%})" if chances else "")

    return (f"; took {part(tactics['wins_taken'], tactics['win_chances'], 'immediate wins')}, "
            f"made {part(tactics['blocks_made'], tactics['block_chances'], 'forced blocks')}")


def _tournament(args: argparse.Namespace) -> int:
    from rich.console import Console

    from evaluation.tournament import ratings_table, resolve_players, round_robin

    env_name, players = resolve_players(args.players, args.env)
    console = Console()
    json_to_stdout = args.json == "-"
    result = round_robin(env_name, players, args.games, seed=args.seed, greedy=not args.sample,
                         workers=args.workers, record_dir=args.record,
                         show_progress=console.is_terminal and not json_to_stdout)
    if args.json:
        _emit_json(result, args.json)
    if not json_to_stdout:
        console.print(ratings_table(result))
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from evaluation.bots import GAMES
    from evaluation.replays import (GIF_FRAME_MS, GIF_STEP_MS, ascii_board, check_gif_path, describe_move,
                                    describe_winner, load_replay, simulate, write_gif)

    if args.gif:
        check_gif_path(args.gif)  # before anything is printed
    replay = load_replay(args.file)
    positions = simulate(replay, args.file, render=bool(args.gif))
    turns = positions[0].units is None  # a turn-based game: a board per move; else a line per step
    shown = positions[-1:] if args.final else positions
    for position in shown:
        print(describe_move(replay, position))
        if replay.env in GAMES:
            print(ascii_board(replay.env, position.observation))
        if turns:
            print()
    if turns and replay.env not in GAMES:
        print(f"actions: {replay.actions}")
    kwargs = f" {replay.kwargs}" if replay.kwargs else ""
    print(f"{replay.env}{kwargs} ({replay.env_version}), seed {replay.seed}: {describe_winner(replay, replay.winner)} "
          f"after {replay.length} {'moves' if turns else 'steps'}; rewards {replay.rewards}; re-simulated and verified")
    if args.gif:
        frames = [p.frame for p in positions if p.frame is not None]
        write_gif(frames, args.gif, GIF_FRAME_MS if turns else GIF_STEP_MS)
        print(f"wrote {args.gif} ({len(frames)} frames)")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    import time

    from analysis.compare import STUDIES, actor_counts, markdown_table, plan, run_study
    from config import MAX_ACTORS, MAX_WEIGHT_DELAY
    from experiment import load_config
    from envs.registry import env_spec
    from evaluation.bots import make_bot

    cfg = _load(args)  # checks the config and overrides before anything runs
    if not args.config:
        raise ConfigError("compare needs --config (the experiment every variant starts from)")
    if args.study not in STUDIES:
        raise ConfigError(f"--study must be one of {', '.join(STUDIES)}")
    if not args.minutes > 0 or (args.frames is not None and args.frames < 1):
        raise ConfigError("--minutes must be > 0 and --frames >= 1")
    if not 0 <= args.lag <= MAX_WEIGHT_DELAY:
        raise ConfigError(f"--lag must be in [0, {MAX_WEIGHT_DELAY}]")
    if not args.seeds or any(not 0 <= s < 2**31 for s in args.seeds):
        raise ConfigError("--seeds must be in [0, 2**31)")
    if args.replay_fraction is not None and not args.replay:
        raise ConfigError("--replay-fraction needs --replay")
    replay_fraction = (0.5 if args.replay_fraction is None else args.replay_fraction) if args.replay else None
    if replay_fraction is not None and not 0 < replay_fraction <= 1:
        raise ConfigError("--replay-fraction must be in (0, 1]: 0 would be the variant without replay")
    out = Path(args.out) if args.out else Path(cfg.run.dir) / f"compare-{args.study}-{time.strftime('%Y%m%d-%H%M%S')}"
    if out.exists():
        raise ConfigError(f"--out {out} exists; compare writes into a new folder")
    if not 0 <= args.eval_games <= MAX_EVAL_GAMES:
        raise ConfigError(f"--eval-games must be in [0, {MAX_EVAL_GAMES}]")
    if args.eval_games and len(env_spec(cfg.env.name, cfg.env.kwargs, cfg.env.seats).seats) > 1:
        if args.eval_opponent is None:
            args.eval_opponent = "tactical" if cfg.env.name in ("connect_four", "tictactoe") else "random"
        try:
            make_bot(args.eval_opponent, cfg.env.name)
        except ValueError as e:
            raise ConfigError(f"--eval-opponent: {e}") from None
    actors = args.actors or actor_counts(os.cpu_count() or 1)
    if any(not 1 <= n <= MAX_ACTORS for n in actors):
        raise ConfigError(f"--actors must be in [1, {MAX_ACTORS}]")
    try:
        variants = plan(args.study, args.lag, args.variants, sorted(set(actors)), replay_fraction)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for name, overrides in variants.items():  # a variant this code base cannot train fails now, not after hours
        try:
            load_config(args.config, [*args.overrides, *overrides])
        except ConfigError as e:
            raise ConfigError(f"variant {name}: {e}") from None
    summary = run_study(args.config, args.study, variants, out, args.seeds, args.minutes, args.frames, args.lag,
                        args.overrides, args.redis_url, args.metric, args.eval_opponent, args.eval_games,
                        replay_fraction)
    print(markdown_table(summary))
    print(f"wrote {out / 'compare.md'}, {out / 'compare.json'} and the plots; `run.py report {out}` shows them")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from analysis.report import build_report

    page = build_report(args.run_dirs)
    out = Path(args.out) if args.out else Path(args.run_dirs[0]) / "report.html"
    try:
        out.write_text(page)
    except OSError as e:
        raise ConfigError(f"cannot write {out}: {e.strerror}") from None
    print(f"wrote {out} ({len(page) / 1e6:.1f} MB)")
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    from analysis.runs import delete_run_keys, list_redis_runs, list_run_dirs

    url = args.redis_url or os.environ.get("IMPALA_REDIS_URL")
    if args.delete:
        if not url:
            raise ConfigError("--delete removes a run's keys from a shared Redis: pass --redis-url")
        from distributed.transport import connect

        deleted = delete_run_keys(connect(url, wait_s=args.wait_redis), args.delete)
        print(f"deleted {deleted} keys of run '{args.delete}'")
        return 0
    rows = list_run_dirs(Path(args.dir))
    print(f"{args.dir}/: {len(rows) or 'no'} run director{'y' if len(rows) == 1 else 'ies'}")
    for row in rows:
        print(f"  {row['name']:<28} {row['state']:<34} {row['env']:<16} {row['frames']:>12,} agent steps trained")
    if url:
        from distributed.transport import connect

        remote = list_redis_runs(connect(url, wait_s=args.wait_redis))
        print(f"Redis: {len(remote) or 'no'} run{'' if len(remote) == 1 else 's'}")
        for row in remote:
            print(f"  {row['name']:<28} {row['state']:<34} {row['keys']:>6} keys {row['bytes'] / 1e6:>9.1f} MB")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    print(to_yaml(without_secrets(_load(args))), end="")
    return 0


REDIS_UNREACHABLE_HINT = ("Start it (or fix the URL or the network) and start this again, or wait for it with "
                          "--wait-redis SECONDS")


def main(argv: list[str] | None = None) -> int:
    """Run one role; returns the process's exit code (README.md, "Exit codes", lists them)."""
    args = build_parser().parse_args(argv)  # a usage error exits here with argparse's code, 2
    _setup_logging()
    from distributed.ownership import REDIS_UNREACHABLE_EXIT, USER_ERROR_EXIT
    from distributed.transport import RedisUnreachable

    commands = {"train": cmd_train, "learner": cmd_learner, "league": cmd_league, "actor": cmd_actor,
                "actors": cmd_actors, "evaluate": cmd_evaluate, "replay": cmd_replay, "compare": cmd_compare,
                "report": cmd_report, "runs": cmd_runs, "config": cmd_config}
    try:
        return commands[args.role](args)
    except RedisUnreachable as e:
        print(f"error: {e} {REDIS_UNREACHABLE_HINT} (exit code {REDIS_UNREACHABLE_EXIT}: Redis unreachable at start)",
              file=sys.stderr)
        return REDIS_UNREACHABLE_EXIT
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return USER_ERROR_EXIT
    except KeyboardInterrupt:  # outside the launcher's own handling (start-up, final evaluation)
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
