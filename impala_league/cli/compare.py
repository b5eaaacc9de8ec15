"""`run.py compare`: several configurations trained one after another for the same wall clock and seeds."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from impala_league.analysis import league_study
from impala_league.analysis.compare import STUDIES, actor_counts, markdown_table, plan, run_study
from impala_league.cli.common import MAX_EVAL_GAMES, config_args, load
from impala_league.config import MAX_ACTORS, MAX_WEIGHT_DELAY, ConfigError, Rule, check_arguments
from impala_league.envs.registry import env_spec
from impala_league.evaluation.bots import make_bot
from impala_league.evaluation.judges import require_judge_packages
from impala_league.checked_config import load_config

NAME = "compare"

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
  --study league       AlphaStar's league ablation: arms selfplay, pfsp, pfsp-main-exploiters,
                       pfsp-league-exploiters, bots, main-job, each WITH its league (default config
                       configs/connect_four_league.yaml); every final policy against the --judges
                       and in one round-robin with Elo (league_study.png; docs/compare.md)

Every variant x seed is a normal `run.py train` run (without a league, but in the league study) in
OUT/<variant>-seed<seed> with its log beside it. Then OUT gets compare.md and compare.json, one row
per variant (means over seeds; per-seed rows in the JSON). Scores read `mean ± h`: h is the
half-width of the 95% confidence interval of the mean over seeds (Student t, n - 1 degrees of
freedom); a score from one seed reads "(one run)", with no interval. A second table gives every
score over seeds: the seeds counted, mean ± h, the interquartile mean (IQM) and its 95% percentile
bootstrap interval (2,000 resamples of the seeds, seeded: rliable's interval estimate) and each
seed's value; compare.json has them all (<score>_ci95, _seeds, _iqm, _iqm_ci95, _per_seed);
docs/seeds.md says more. The columns:
  SPS             agent steps per second the learner (A3C: parameter server) trained on, mean
  SPS ratio       the variant's SPS over the first variant's (impala, resp. vtrace)
  agent steps trained
                  agent steps trained on by the end of the budget
  policy lag      learner updates between acting and learning (A3C: gradient staleness)
  final score     the score at the end of the run
  final score vs bot
                  two-player games: the final checkpoint, greedy, against --eval-opponent in both
                  seats (wins + draws / 2); self-play returns measure nothing there
  score at equal wall clock / at equal agent steps
                  the score when the shortest run ended, resp. at the fewest agent steps any run reached
and curves_wall_clock.png, curves_agent_steps.png (the score of every run against both axes),
curves_seeds.png (a panel per variant: every seed's curve thin, their IQM bold).
The score is the metric --metric of metrics.jsonl, by default league_score where recorded, else
episode_return (the learning seat's return: the score of single-agent envs such as gym:CartPole-v1;
~0 in two-player self-play). `run.py report OUT` shows it all on one page.

  run.py compare --config configs/tictactoe.yaml --minutes 10 --seeds 0 1 2
  run.py compare --config configs/cartpole.yaml --study corrections --lag 20 --minutes 5 --seeds 0 1 2
  run.py compare --config configs/cartpole.yaml --study corrections --replay --lag 20 --minutes 1 --seeds 0 1 2 3 4
  run.py compare --study league --minutes 3 --seeds 0 1 2
"""


# The options' own rules (config.check_arguments); the config's are beside its fields. --replay-fraction
# excludes 0: that would be the variant without replay.
ALL_STUDIES = (*STUDIES, league_study.STUDY)
ARGUMENT_RULES = {"study": Rule(choices=ALL_STUDIES), "minutes": Rule(low=0, low_open=True, finite=True),
                  "agent_steps": Rule(low=1), "lag": Rule(low=0, high=MAX_WEIGHT_DELAY),
                  "seeds": Rule(low=0, high=2**31, high_open=True), "replay_fraction": Rule(low=0, high=1, low_open=True),
                  "eval_games": Rule(low=0, high=MAX_EVAL_GAMES), "actors": Rule(low=1, high=MAX_ACTORS),
                  "judge_games": Rule(low=0, high=MAX_EVAL_GAMES), "round_robin_games": Rule(low=0, high=MAX_EVAL_GAMES)}
# Options of the league study alone, and those it has no use for (its judges replace the bot evaluation).
LEAGUE_ONLY = ("judges", "judge_games", "round_robin_games")
NOT_LEAGUE = ("actors", "replay", "replay_fraction", "eval_opponent", "eval_games")


def add_parser(sub, help: str) -> argparse.ArgumentParser:
    """The `compare` command's parser, added to the subparsers `sub` of run.py."""
    p = sub.add_parser(NAME, help=help,
                       description=COMPARE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    config_args(p)
    p.add_argument("--study", default="algos", help="algos (IMPALA vs A3C, default), corrections, actors or league")
    p.add_argument("--actors", type=int, nargs="+", help="actors study: the actor counts (default 1, 2, 4, ... "
                   "up to the cores)")
    p.add_argument("--minutes", type=float, default=10.0, help="wall-clock budget of each run (default 10)")
    p.add_argument("--agent-steps", type=int, help="also end each run at this many agent steps trained (default: "
                   "only the budget)")
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
    p.add_argument("--eval-games", type=int, help="games per seat of that evaluation (default 100; 0 = none)")
    p.add_argument("--judges", nargs="+", help="league study: the outside judges every final policy plays, never "
                   "a training opponent (default mcts:100 mcts:400)")
    p.add_argument("--judge-games", type=int, help="league study: games per seat against each judge (default 10)")
    p.add_argument("--round-robin-games", type=int, help="league study: games per pair and seat of the round-robin "
                   "of all final policies, sampled (default 10; 0 = none)")
    return p


def run(args: argparse.Namespace) -> int:
    """Check the study and every variant, run them one after another, print the table."""
    if args.study == league_study.STUDY:
        return run_league(args)
    given = [name for name in LEAGUE_ONLY if getattr(args, name) is not None]
    if given:
        raise ConfigError(f"--{given[0].replace('_', '-')} belongs to the league study (--study league)")
    args.eval_games = 100 if args.eval_games is None else args.eval_games
    cfg = load(args)  # checks the config and overrides before anything runs
    if not args.config:
        raise ConfigError("compare needs --config (the experiment every variant starts from)")
    check_arguments(args, ARGUMENT_RULES)
    if args.replay_fraction is not None and not args.replay:
        raise ConfigError("--replay-fraction needs --replay")
    replay_fraction = (0.5 if args.replay_fraction is None else args.replay_fraction) if args.replay else None
    out = Path(args.out) if args.out else Path(cfg.run.dir) / f"compare-{args.study}-{time.strftime('%Y%m%d-%H%M%S')}"
    if out.exists():
        raise ConfigError(f"--out {out} exists; compare writes into a new folder")
    if args.eval_games and len(env_spec(cfg.env.name, cfg.env.kwargs, cfg.env.seats).seats) > 1:
        if args.eval_opponent is None:
            args.eval_opponent = "tactical" if cfg.env.name in ("connect_four", "tictactoe") else "random"
        try:
            make_bot(args.eval_opponent, cfg.env.name)
        except ValueError as e:
            raise ConfigError(f"--eval-opponent: {e}") from None
    actors = args.actors or actor_counts(os.cpu_count() or 1)
    try:
        variants = plan(args.study, args.lag, args.variants, sorted(set(actors)), replay_fraction)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for name, overrides in variants.items():  # a variant this code base cannot train fails now, not after hours
        try:
            load_config(args.config, [*args.overrides, *overrides])
        except ConfigError as e:
            raise ConfigError(f"variant {name}: {e}") from None
    summary = run_study(args.config, args.study, variants, out, args.seeds, args.minutes, args.agent_steps, args.lag,
                        args.overrides, args.redis_url, args.metric, args.eval_opponent, args.eval_games,
                        replay_fraction)
    print(markdown_table(summary))
    print(f"wrote {out / 'compare.md'}, {out / 'compare.json'} and the plots; `run.py report {out}` shows them")
    return 0


def run_league(args: argparse.Namespace) -> int:
    """`--study league`: check every arm (analysis/league_study.py `check_arms`), train them, judge them,
    play the round-robin, print the table."""
    args.config = args.config or str(league_study.DEFAULT_CONFIG)
    given = [name for name in NOT_LEAGUE if getattr(args, name) not in (None, False)]
    if given:
        raise ConfigError(f"--{given[0].replace('_', '-')} is not an option of the league study (its final "
                          "policies play --judges and a round-robin)")
    cfg = load(args)
    check_arguments(args, ARGUMENT_RULES)
    judges = args.judges or list(league_study.DEFAULT_JUDGES)
    judge_games = league_study.DEFAULT_JUDGE_GAMES if args.judge_games is None else args.judge_games
    games = league_study.DEFAULT_ROUND_ROBIN_GAMES if args.round_robin_games is None else args.round_robin_games
    out = Path(args.out) if args.out else Path(cfg.run.dir) / f"compare-league-{time.strftime('%Y%m%d-%H%M%S')}"
    if out.exists():
        raise ConfigError(f"--out {out} exists; compare writes into a new folder")
    try:
        arms = league_study.arm_plan(args.variants)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    league_study.check_arms(args.config, args.overrides, arms, judges)
    if judge_games:
        require_judge_packages(judges)  # the judges play after the first run: fail now, not after it
    summary = league_study.run_league_study(args.config, arms, out, args.seeds, args.minutes, args.agent_steps,
                                            args.overrides, args.redis_url, judges, judge_games, games, args.metric)
    print(league_study.league_table(summary))
    print(f"wrote {out / 'compare.md'}, {out / 'compare.json'} and {league_study.PLOT}; `run.py report {out}` "
          "shows them")
    return 0
