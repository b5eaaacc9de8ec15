"""`run.py evaluate`: a checkpoint against a baseline bot, or a round-robin of players with Elo ratings."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from impala_league.agents.policy import load_policy
from impala_league.cli.common import MAX_EVAL_GAMES, emit_json
from impala_league.config import ConfigError
from impala_league.evaluation.atari_judge import judge, judge_line
from impala_league.evaluation.atari_protocol import DEFAULT as DEFAULT_PROTOCOL
from impala_league.evaluation.atari_protocol import GAMES as PROTOCOL_GAMES
from impala_league.evaluation.atari_protocol import PROTOCOLS, evaluate_atari, summary_text
from impala_league.evaluation.bots import make_bot
from impala_league.evaluation.evaluate import episode_returns, evaluate
from impala_league.evaluation.final import checkpoint_facts, seat_line
from impala_league.evaluation.positions import check_count, evaluate_positions, positions_lines
from impala_league.evaluation.tournament import checkpoint_player, ratings_table, resolve_players, round_robin
from impala_league.text import plural

NAME = "evaluate"

EVALUATE_HELP = """Play trained policies and baseline bots against each other.

One checkpoint against one baseline bot, in both seats (win/draw/loss rates per seat):
  run.py evaluate --checkpoint runs/connect_four/checkpoints/latest.safetensors --opponent minimax:2

A round-robin: every pair of players plays --games games in each seat, then a table of win/draw/
loss percentages and Elo ratings (Bradley-Terry maximum likelihood, draws count half, mean rating
0, +- one standard error). A player is a bot (random, tactical, minimax:D with D plies of search,
or the outside judges mcts:N, OpenSpiel's MCTS with N simulations a move, connect_four and tictactoe, and
solver / solver:E, connect four's perfect player, with probability E a random move instead),
a .safetensors checkpoint or league snapshot, or a run directory, which stands for its learners'
latest checkpoints and all its league snapshots:
  run.py evaluate --players runs/connect_four tactical minimax:2 --games 50 --workers 2 --json out.json

Connect four's perfect player judges moves: a checkpoint's (or each of --players') move in 1,000 seeded
positions where the game is not over, scored by the solver: the rate of optimal moves and of blunders (a won
or drawn position turned lost), by phase, with 95% intervals (docs/evaluation.md, "The solver"):
  run.py evaluate --checkpoint runs/connect_four_league/checkpoints/latest.safetensors --positions 1000
  run.py evaluate --players minimax:2 minimax:4 --env connect_four --positions 1000

An Atari policy plays under the evaluation protocol (docs/atari.md, "The evaluation protocol"): --protocol
sticky (the default: actions repeated with probability 0.25, Machado et al. 2018) or deterministic (none),
--games games (default 30) seeded --seed + k; one-player Atari (atari:<Game>) greedy, then sampled:
  run.py evaluate --checkpoint runs/atari_pong --protocol sticky
A two-player Atari policy (atari2p:<game>) as one seat of the one-player game (atari:<Game>, gymnasium's
ALE/<Game>-v5 and its own wrappers) against the game's built-in player, its return per game (the policy's
points minus the built-in player's); docs/atari_judge.md:
  run.py evaluate --checkpoint runs/atari_pong_league/checkpoints/latest.safetensors --env atari:Pong --seat first_0
"""


MAX_WORKERS = 64


def add_parser(sub, help: str) -> argparse.ArgumentParser:
    """The `evaluate` command's parser, added to the subparsers `sub` of run.py."""
    p = sub.add_parser(NAME, help=help,
                       description=EVALUATE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--checkpoint", help="a learner checkpoint (runs/<name>/checkpoints/latest.safetensors), or "
                     "a run directory for its checkpoints/latest.safetensors, to play against --opponent in both seats")
    who.add_argument("--players", nargs="+", metavar="SPEC",
                     help="round-robin between these players: bots (random, tactical, minimax:D, mcts:N), "
                     ".safetensors checkpoints, and run directories (their latest checkpoints and league snapshots)")
    p.add_argument("--opponent", help="with --checkpoint: baseline bot random, tactical or minimax:D, or the judges "
                   "mcts:N (OpenSpiel's MCTS, N simulations a move) and solver / solver:E (connect four's perfect "
                   "player; with probability E a random move); default random")
    p.add_argument("--positions", type=int, metavar="N", help="connect four: instead of games, score the move of "
                   "--checkpoint (or of each of --players) in N seeded positions by the solver: optimal and "
                   "blunder rates by phase (1000 takes about 20 s to solve)")
    p.add_argument("--env", help="with --players: the game (connect_four, tictactoe); needed only when all "
                   "players are bots, else taken from the checkpoints. With --checkpoint and --seat: the one-player "
                   "Atari game atari:<Game> the two-player policy plays")
    p.add_argument("--seat", help="with --checkpoint of a two-player atari2p:<game> and --env atari:<Game>: the "
                   "player whose observation the policy gets (its indicator plane lit) in the one-player game, "
                   "against the game's built-in player: first_0, ALE's player one")
    p.add_argument("--games", type=int, help="games per seat (per pair and seat with --players; "
                   "default 200; Atari: games under the evaluation protocol, default 30)")
    p.add_argument("--protocol", choices=tuple(PROTOCOLS), help="Atari (atari:<Game>, or atari2p:<game> with --seat): "
                   "the evaluation protocol, sticky (default; sticky actions 0.25) or deterministic (none)")
    p.add_argument("--seed", type=int, default=0, help="seed of the games and the bots")
    p.add_argument("--sample", action="store_true", help="sample from the policies instead of playing greedily "
                   "(two greedy policies play the same game every time); a one-player Atari policy then plays "
                   "sampled only")
    p.add_argument("--workers", type=int, default=1, help="with --players: pairs played at once, each in its own "
                   "process (default 1: all in this process)")
    p.add_argument("--json", "--out", dest="json", nargs="?", const="-", metavar="FILE",
                   help="write the results as JSON to FILE (with --players: every match and the ratings); "
                   "without FILE, or with -, print the JSON instead of the table")
    p.add_argument("--record", metavar="DIR", help="save every game as a JSON replay in DIR "
                   "(<seat 0>-vs-<seat 1>-<game>.json; see `run.py replay`)")
    return p


def run(args: argparse.Namespace) -> int:
    """Play a checkpoint against a bot in both seats (one-agent envs: episodes), or a round-robin."""
    check_evaluate_args(args)
    if args.positions is not None:
        return positions(args)
    if args.players is not None:
        return tournament(args)
    if args.seat is not None:
        return one_player_game(args)
    opponent = args.opponent or "random"
    policy = load_policy(args.checkpoint, seed=args.seed)
    if args.games is None:  # an Atari game lasts thousands of steps
        args.games = PROTOCOL_GAMES if policy.spec.name.startswith("atari:") else 200
    name = checkpoint_player(Path(args.checkpoint), args.checkpoint).name if args.record else "checkpoint"
    if policy.spec.name.startswith("atari:"):
        return atari_alone(args, policy, name)
    if args.protocol is not None:
        raise ConfigError(f"--protocol: {policy.spec.name} has no sticky actions: --protocol is for Atari policies "
                          "(atari:<Game>, or atari2p:<game> with --seat)")
    if len(policy.spec.seats) == 1:
        result = episode_returns(policy, args.games, seed=args.seed, greedy=not args.sample,
                                 record_dir=args.record, name=name)
        result.update(checkpoint_facts(args.checkpoint), seed=args.seed)
        if args.json:
            emit_json(result, args.json)
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
    result.update(checkpoint_facts(args.checkpoint), seed=args.seed)
    if args.json:
        emit_json(result, args.json)
    if args.json != "-":
        print(f"{result['env']}: checkpoint vs {opponent}, {plural(args.games, 'game')} per seat")
        for seat, r in result["seats"].items():
            print(f"  {seat_line(seat, r)}")
    return 0


def atari_alone(args: argparse.Namespace, policy, name: str) -> int:
    """A one-player Atari policy under --protocol (evaluation/atari_protocol.py): --games games greedy, then
    sampled (--sample: sampled only), as lines or JSON."""
    protocol = args.protocol or DEFAULT_PROTOCOL
    result = evaluate_atari(policy, args.games, seed=args.seed, name=protocol,
                            modes=(False,) if args.sample else (True, False), record_dir=args.record, player=name)
    result.update(checkpoint_facts(args.checkpoint), seed=args.seed, env=policy.spec.name)
    if args.json:
        emit_json(result, args.json)
    if args.json != "-":
        settings = result["protocol"]
        print(f"{policy.spec.name}: {plural(args.games, 'game')}, {protocol} protocol (sticky actions "
              f"{settings['sticky_actions']}, up to {settings['noop_max']} no-op starts, frame skip "
              f"{settings['frame_skip']}, cut at {settings['max_episode_frames']:,} emulator frames)")
        for mode in ("greedy", "sampled"):
            if mode in result:
                print(f"  {summary_text(result[mode])}")
    return 0


def checkpoint_file(path: str) -> str:
    """--checkpoint as a file: `path` itself, or for a directory (a run directory) its
    checkpoints/latest.safetensors. Raises ConfigError for a directory without that file."""
    if not Path(path).is_dir():
        return path  # a missing file is load_policy's error, which names it
    latest = Path(path) / "checkpoints" / "latest.safetensors"
    if not latest.is_file():
        raise ConfigError(f"--checkpoint {path}: a directory without checkpoints/latest.safetensors; give a run "
                          "directory whose learner wrote a checkpoint, or a .safetensors file")
    return str(latest)


def check_evaluate_args(args: argparse.Namespace) -> None:
    """Refuse arguments that do not go together or are out of range (ConfigError); fill --games; make a
    run directory given as --checkpoint its checkpoints/latest.safetensors."""
    if args.checkpoint is not None:
        args.checkpoint = checkpoint_file(args.checkpoint)
    if args.positions is not None:
        try:
            check_count(args.positions)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        for flag, given in (("--opponent", args.opponent), ("--seat", args.seat), ("--games", args.games),
                            ("--record", args.record), ("--protocol", args.protocol)):
            if given is not None:
                raise ConfigError(f"{flag} does not go with --positions, which scores single moves, not games")
    if args.games is None and args.checkpoint is None:
        args.games = 200
    elif args.games is None and args.seat is not None:
        args.games = PROTOCOL_GAMES  # an Atari game lasts thousands of steps
    if args.games is not None and not 1 <= args.games <= MAX_EVAL_GAMES:
        raise ConfigError(f"--games must be in [1, {MAX_EVAL_GAMES}]")  # every game is a live env at once
    if not 0 <= args.seed < 2**31:
        raise ConfigError("--seed must be in [0, 2**31)")
    if args.players is not None:
        if args.opponent is not None:
            raise ConfigError("--opponent goes with --checkpoint; with --players list the bot among the players")
        if args.protocol is not None:
            raise ConfigError("--protocol goes with --checkpoint of an Atari policy")
        if args.seat is not None:
            raise ConfigError("--seat goes with --checkpoint (a two-player Atari policy in the one-player game)")
        if not 1 <= args.workers <= MAX_WORKERS:
            raise ConfigError(f"--workers must be in [1, {MAX_WORKERS}]")
    else:
        if args.seat is not None and args.env is None:
            raise ConfigError("--seat needs --env atari:<Game>: the one-player game the two-player policy plays")
        if args.env is not None and args.seat is None:
            raise ConfigError("--env goes with --players, or with --checkpoint and --seat (a two-player Atari policy "
                              "in the one-player game: --env atari:<Game> --seat first_0); a checkpoint names its own env")
        if args.seat is not None and args.opponent is not None:
            raise ConfigError("--opponent does not go with --seat: the one-player game's opponent is its built-in player")
        if args.seat is not None and args.record:
            raise ConfigError("--record does not go with --seat: games of the one-player game are not recorded")
        if args.workers != 1:
            raise ConfigError("--workers goes with --players")
    if args.record:
        try:
            Path(args.record).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"--record: cannot create the directory {args.record}: {e.strerror}") from None


def positions(args: argparse.Namespace) -> int:
    """--checkpoint's move, or each of --players' moves, in --positions positions scored by the solver
    (evaluation/positions.py), as lines or JSON."""
    if args.players is not None:
        env_name, players = resolve_players(args.players, args.env, minimum=1)
        entrants = [(p.name, make_bot(p.load, env_name, seed=args.seed) if p.kind == "bot"
                     else load_policy(p.load, seed=args.seed)) for p in players]
    else:
        policy = load_policy(args.checkpoint, seed=args.seed)
        env_name, entrants = policy.spec.name, [("checkpoint", policy)]
    results = {}
    for name, player in entrants:
        try:
            results[name] = evaluate_positions(player, env_name, args.positions, seed=args.seed,
                                               greedy=not args.sample)
        except ValueError as e:
            raise ConfigError(f"--positions: {e}") from None
        if args.json != "-":
            print(f"{name}: " + "\n".join(positions_lines(results[name])))
    if args.json:
        emit_json(results if args.players is not None else {**results["checkpoint"],
                                                            **checkpoint_facts(args.checkpoint)}, args.json)
    return 0


def one_player_game(args: argparse.Namespace) -> int:
    """The checkpoint's two-player Atari policy as --seat of the one-player game --env, against its built-in
    player (evaluation/atari_judge.py), as a line or JSON."""
    policy = load_policy(args.checkpoint, seed=args.seed)
    result = judge(policy, args.env, args.seat, args.games, seed=args.seed, greedy=not args.sample,
                   checkpoint=args.checkpoint, protocol=args.protocol or DEFAULT_PROTOCOL)
    result.update(checkpoint_facts(args.checkpoint))
    if args.json:
        emit_json(result, args.json)
    if args.json != "-":
        print(judge_line(result))
    return 0


def tournament(args: argparse.Namespace) -> int:
    """A round-robin of --players with Elo ratings, as a table or JSON."""
    env_name, players = resolve_players(args.players, args.env)
    console = Console()
    json_to_stdout = args.json == "-"
    result = round_robin(env_name, players, args.games, seed=args.seed, greedy=not args.sample,
                         workers=args.workers, record_dir=args.record,
                         show_progress=console.is_terminal and not json_to_stdout)
    if args.json:
        emit_json(result, args.json)
    if not json_to_stdout:
        console.print(ratings_table(result))
    return 0
