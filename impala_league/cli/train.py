"""`run.py train`: a whole training run on this machine, supervised to its end, then evaluated.

Imports no torch before the children start (tests/test_layers.py checks it): `train` only supervises."""

from __future__ import annotations

import argparse
import contextlib
import logging
import shutil
import signal
import sys
from pathlib import Path

from impala_league.analysis.summary import end_summary
from impala_league.checked_config import load_config
from impala_league.cli.common import (MAX_EVAL_GAMES, config_args, connect_waiting, load, redis_url, require_game,
                                      wait_redis_arg)
from impala_league.config import Config, ConfigError, Rule, check_arguments
from impala_league.distributed.launch.launcher import EmbeddedRedis, supervise
from impala_league.distributed.launch.live import LiveView
from impala_league.distributed.launch.ownership import (check_resumable, claim_run_dir, has_checkpoint, new_run_dir,
                                                        run_lease, write_run_config)
from impala_league.evaluation.atari_protocol import GAMES as PROTOCOL_GAMES
from impala_league.evaluation.judges import require_judge_packages, resolve_judges
from impala_league.evaluation.solver import SOLVER_GAMES
from impala_league.text import plural

log = logging.getLogger("run")

NAME = "train"

MAX_EVAL_HISTORY = 50  # earlier policies played after training; each 1-2 s in connect four at 50 games per seat


# The options' own rules (config.check_arguments); the config's are beside its fields.
ARGUMENT_RULES = {"eval_games": Rule(high=MAX_EVAL_GAMES), "eval_history": Rule(low=0, high=MAX_EVAL_HISTORY),
                  "eval_history_games": Rule(low=1, high=MAX_EVAL_GAMES)}


def add_parser(sub, help: str) -> argparse.ArgumentParser:
    """The `train` command's parser, added to the subparsers `sub` of run.py."""
    p = sub.add_parser(NAME, help=help,
                       epilog='example: .venv/bin/python run.py train --config configs/tictactoe.yaml')
    config_args(p)
    p.add_argument("--resume", nargs="?", const=True, metavar="RUN_DIR",
                   help="continue the run in RUN_DIR from its checkpoint, with RUN_DIR/config.yaml as the config "
                   "(--set changes values; the network, env and optimizer must stay); without RUN_DIR, continue "
                   "<run.dir>/<run.name> of --config")
    p.add_argument("--eval-games", type=int,
                   help="games per seat against each baseline bot after training (default 200, two-player Atari "
                   "20; one-player Atari: games under the evaluation protocol, greedy then sampled, default 30; "
                   "0 = skip)")
    p.add_argument("--eval-history", type=int, metavar="N",
                   help="games of several seats: also play up to N earlier policies of the run (a league's main "
                   "snapshots, else checkpoints/history/) against the same bots after training, to see how it "
                   "learned (default 6, Atari games 3; 0 = none)")
    p.add_argument("--eval-history-games", type=int, metavar="G",
                   help="games per seat and bot of each earlier policy (default 50, Atari games 5)")
    wait_redis_arg(p, "a shared Redis (--redis-url) and the trajectory shards' servers")
    return p


def run(args: argparse.Namespace) -> int:
    """Start (or connect to) Redis, the learners, the league manager and the actors in a fresh run directory
    (or the one resumed), supervise them to the end, then evaluate the final checkpoint."""
    # Until the launcher takes over: a SIGTERM or a closed terminal (SIGHUP) stops start-up as Ctrl-C does.
    # SIGINT too: a shell starts a background job with it ignored, which Python keeps, and the launcher
    # answers it once it supervises; start-up must not be the one window where it does nothing.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)
    resume = args.resume is not None
    cfg = train_config(args)
    require_game(cfg)
    check_arguments(args, ARGUMENT_RULES)
    evaluation_defaults(args, cfg.env.name)
    if args.eval_games > 0:  # the end-of-run evaluation plays the judges: fail now, not after training
        require_judge_packages(resolve_judges(cfg.evaluation.judges, cfg.env.name) if cfg.evaluation.judge_games else (),
                               positions=cfg.env.name in SOLVER_GAMES and cfg.evaluation.positions > 0)
    url = redis_url(args, cfg)
    client = connect_waiting(args, cfg, url, shards=True) if url else None  # fail fast with a clear message
    if cfg.learner.device != "auto" or cfg.learner.num_learners > 1:  # auto alone cannot fail (nor needs torch)
        from impala_league.distributed.learner.update import pick_device  # torch: only for a device that can fail

        device = pick_device(cfg.learner.device)  # fail fast: e.g. learner.device=cuda on a machine without CUDA
        check_learner_gpus(cfg, device)
    run_dir = new_run_dir(cfg, resume)
    # A live progress view on a terminal, through training and the final evaluation; plain log lines otherwise.
    view = LiveView(cfg, run_dir / "metrics.jsonl") if sys.stdout.isatty() else None
    with view or contextlib.nullcontext():
        code, finished = supervised(args, cfg, client, run_dir, url, resume, view)
        if finished and code == 0:
            evaluate_final(args, cfg, run_dir, view)
    if finished and code == 0:
        for line in end_summary(run_dir, cfg.run.name):
            log.info("%s", line)
    return code


def supervised(args: argparse.Namespace, cfg: Config, client, run_dir: Path, url: str | None, resume: bool,
               view: LiveView | None) -> tuple[int, bool]:
    """`train` in the claimed run directory, under the run name's lease on a shared Redis; a fresh run that
    stopped before its first checkpoint leaves no directory. Returns (exit code, finished) and says how to
    go on where the run stopped early."""
    with run_lease(client, cfg) if client is not None else contextlib.nullcontext():  # before anything is made
        lock = claim_run_dir(run_dir, resume)
        code = None
        try:
            code, finished = train(args, cfg, run_dir, url, resume, view)
        finally:
            if not resume and (code is None or code >= 128) and not has_checkpoint(run_dir):
                # Nothing to resume: a directory left here would only push the next run to <name>-2.
                shutil.rmtree(run_dir, ignore_errors=True)
                log.info("removed %s: the run stopped before its first checkpoint", run_dir)
            lock.release()
    checkpoint = run_dir / "checkpoints" / "latest.safetensors"
    if finished and code >= 128:
        log.info("the run reached its end (the signal came while its learner was closing); no final evaluation: "
                 "`run.py evaluate --checkpoint %s` plays it", checkpoint)
    elif not finished and has_checkpoint(run_dir) and code in (0, *range(128, 160)):
        log.info("stopped before the end of the run; `run.py train --resume %s` continues it", run_dir)
    return code, finished


def evaluate_final(args: argparse.Namespace, cfg: Config, run_dir: Path, view: LiveView | None) -> None:
    """The final checkpoint's evaluation (evaluation/final.py), `--eval-games` per seat; none for StarCraft
    II, whose bots play other actions."""
    checkpoint = run_dir / "checkpoints" / "latest.safetensors"
    if not checkpoint.exists() or args.eval_games <= 0:
        return
    if cfg.env.name.startswith("sc2:"):
        log.info("StarCraft II: no baseline-bot evaluation after training (the bots play Discrete actions); "
                 "checkpoint: %s", checkpoint)
        return
    from impala_league.evaluation.final import final_evaluation  # torch, after training only

    if view is not None:
        view.evaluating(f"evaluating the final policy: {plural(args.eval_games, 'game')} per seat against each "
                        "baseline bot, then the judges")
    final_evaluation(cfg, checkpoint, args.eval_games, run_dir, args.eval_history, args.eval_history_games)


def evaluation_defaults(args: argparse.Namespace, env: str) -> None:
    """Fill the evaluation options not given: 200 games per seat, 6 earlier policies at 50 games; for Atari
    games (atari:, atari2p:), whose games last thousands of steps (a 200-game evaluation of Pong would
    take over an hour on 2 cores), 20, 3 and 5, and for one-player Atari (atari:) the evaluation
    protocol's games (evaluation/atari_protocol.py: 30)."""
    atari = env.startswith(("atari:", "atari2p:"))
    games = PROTOCOL_GAMES if env.startswith("atari:") else 20
    for name, board, screen in (("eval_games", 200, games), ("eval_history", 6, 3), ("eval_history_games", 50, 5)):
        if getattr(args, name) is None:
            setattr(args, name, screen if atari else board)


def train_config(args: argparse.Namespace) -> Config:
    """`train`'s config: --config + --set, or with `--resume RUN_DIR` that run's own config.yaml + --set
    (run.dir and run.name then come from RUN_DIR). Without either, refused: the built-in defaults make an
    open-ended run that nobody asked for."""
    if not isinstance(args.resume, str):
        if not args.config and not args.help_config:
            raise ConfigError("run.py train needs --config FILE (configs/ holds one per experiment; "
                              "configs/tictactoe.yaml trains in a few minutes) or --resume RUN_DIR")
        return load(args)
    if args.help_config:
        return load(args)
    run_dir = Path(args.resume)
    if args.config:
        raise ConfigError("--resume RUN_DIR reads RUN_DIR/config.yaml: drop --config (change values with --set), "
                          "or use --config with a bare --resume")
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"--resume {run_dir}: no config.yaml there; is it a run directory?")
    cfg = load_config(run_dir / "config.yaml", args.overrides)
    cfg.run.dir, cfg.run.name = str(run_dir.parent), run_dir.name
    return cfg


def check_learner_gpus(cfg: Config, device) -> None:
    """`run.py train` starts its K learners on this machine: on CUDA each needs a GPU of its own (NCCL
    refuses two ranks on one GPU). Raises ConfigError."""
    import torch  # only with several learners on CUDA

    learners = cfg.learner.num_learners
    if learners == 1 or device.type != "cuda":
        return
    if device.index is not None:
        raise ConfigError(f"learner.num_learners={learners} on one machine takes one GPU per learner: set "
                          f"learner.device=cuda (learner rank r takes GPU r), not {cfg.learner.device}")
    if learners > torch.cuda.device_count():
        raise ConfigError(f"learner.num_learners={learners} needs one GPU per learner and this machine has "
                          f"{torch.cuda.device_count()}: lower it, or set learner.device=cpu")


def train(args: argparse.Namespace, cfg: Config, run_dir: Path, url: str | None, resume: bool,
          view: LiveView | None = None) -> tuple[int, bool]:
    """The run itself, in its locked directory: config file, Redis, supervision. Returns supervise's
    (exit code, finished)."""
    if resume:
        if not has_checkpoint(run_dir):  # checked once the directory is ours: a live run has none yet
            raise ConfigError(f"--resume: no checkpoint under {run_dir}: the run stopped before its first one; "
                              "start it again without --resume")
        check_resumable(cfg, run_dir)
    config_path = run_dir / "config.yaml"
    write_run_config(run_dir, cfg, "run.dir")  # children get the URL from the environment
    log.info("run %s: %s, %d actors x %d envs; run directory %s", cfg.run.name, cfg.env.name,
             cfg.actor.num_actors, cfg.actor.num_envs, run_dir)
    if url:
        return supervise(cfg, config_path, run_dir, url, resume, view)
    with EmbeddedRedis(run_dir / "redis", restart_on_exit=True) as server:  # its AOF lives in the run dir
        log.info("embedded redis-server on 127.0.0.1:%d (password protected)", server.port)
        return supervise(cfg, config_path, run_dir, server.url, resume, view)
