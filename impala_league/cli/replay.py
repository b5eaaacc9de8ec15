"""`run.py replay`: re-simulate a recorded game, check it, and show it."""

from __future__ import annotations

import argparse

from impala_league.evaluation.bots import GAMES
from impala_league.evaluation.replays import (GIF_FRAME_MS, GIF_STEP_MS, ascii_board, check_gif_path, describe_move,
                                describe_winner, load_replay, simulate, write_gif)

NAME = "replay"

REPLAY_HELP = """Re-simulate a game saved by `run.py evaluate --record DIR` in the same env version,
kwargs and seed, check every action is legal and that rewards and outcome match the record, and show
it: a text board per move (X moves first) or, in simultaneous-move and one-agent games, a line per
step with units left and reward so far per team; only the last with --final. --gif writes an
animation (simultaneous games: 100 ms per step, every k-th step past 250 steps).
A replay that does not re-simulate to what it records is an error (exit code 2).
"""


def add_parser(sub, help: str) -> argparse.ArgumentParser:
    """The `replay` command's parser, added to the subparsers `sub` of run.py."""
    p = sub.add_parser(NAME, help=help,
                       epilog='example: .venv/bin/python run.py replay replays/minimax_2-vs-tactical-0000.json --gif game.gif',
                       description=REPLAY_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="a replay written by `run.py evaluate --record DIR`")
    p.add_argument("--final", action="store_true", help="print only the final board (or step) instead of one per move")
    p.add_argument("--gif", metavar="OUT.gif", help="also write an animated GIF of the env's own rendering, "
                   "one frame for the start and one per move or step")
    return p


def run(args: argparse.Namespace) -> int:
    """Re-simulate the replay, check it and print it (and write its GIF)."""
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
