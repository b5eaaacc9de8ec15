"""Game replays: one small JSON file per game, re-simulated and checked before it is shown.

Format (version ``REPLAY_FORMAT``)::

    {"format": 1, "env": "connect_four", "env_version": "connect_four_v3", "pettingzoo": "1.27.0",
     "seed": 17, "seats": ["player_0", "player_1"], "players": ["minimax:2", "random"],
     "actions": [3, 3, 4, ...], "rewards": [1.0, -1.0], "winner": 0, "length": 13}

``seed`` is the env's reset seed, ``players[s]`` the display name of the player in seat ``s``
(seat 0 moves first), ``actions`` every action in order of play, ``rewards`` the summed reward per
seat, ``winner`` the winning seat or null for a draw, ``length`` the number of actions.

A replay is trusted only after ``simulate`` has replayed it in the same env (same versioned
PettingZoo module, same seed): every recorded action must be legal where it is played, the game must
end exactly after the last one, and rewards, winner and length must match. JSON only: nothing is
unpickled.
"""

from __future__ import annotations

import errno
import json
import os
import re
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from envs.registry import env_spec, make_raw_env
from evaluation.bots import GAMES

REPLAY_FORMAT = 1
"""Version of the replay file format written by this module."""

GIF_SCALE = 0.5
"""GIF frames are the env's render scaled by this factor (connect four: 891 x 774 -> 445 x 387)."""
GIF_FRAME_MS = 600
"""How long each position is shown in a GIF, in milliseconds (the final one three times longer)."""


class ReplayError(ValueError):
    """A replay that cannot be read or does not re-simulate to what it records; names the file."""


@dataclass(frozen=True)
class Replay:
    """One recorded game; fields as in the module docstring."""

    format: int
    env: str
    env_version: str
    pettingzoo: str
    seed: int
    seats: list[str]
    players: list[str]
    actions: list[int]
    rewards: list[float]
    winner: int | None
    length: int


def _pettingzoo_version() -> str:
    import pettingzoo

    return pettingzoo.__version__


def make_replay(env_name: str, players: tuple[str, str], record) -> Replay:
    """The replay of one finished game.

    record: an `evaluation.evaluate.GameRecord` (seed, actions, returns, winner).
    """
    spec = env_spec(env_name)
    return Replay(REPLAY_FORMAT, env_name, spec.version or env_name, _pettingzoo_version(), int(record.seed),
                  list(spec.seats), list(players), [int(a) for a in record.actions],
                  [float(r) for r in record.returns], record.winner, len(record.actions))


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "player"


_NO_HARD_LINKS = (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS)
"""`os.link` errors of file systems without hard links."""


def _create(tmp: Path, path: Path, text: str) -> bool:
    """Put `text` (already written to `tmp`) at `path` unless something is there already (then False).

    Never replaces an existing file, even when other processes write to the same directory at once.
    Atomic (no reader sees a partly written file) where the file system has hard links.
    """
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError as e:
        if e.errno not in _NO_HARD_LINKS:
            raise
    try:
        with open(path, "x") as f:
            f.write(text)
    except FileExistsError:
        return False
    return True


def save_match(directory: str | Path, env_name: str, players: tuple[str, str], records: Iterable) -> list[Path]:
    """Save each game of one match as ``<directory>/<seat 0>-vs-<seat 1>-<game:04d>.json``.

    players: display names of the seat-0 and seat-1 players (characters other than letters,
    digits, ``.``, ``_``, ``-`` become ``_`` in file names). An existing file is never overwritten:
    when the name is taken (two players whose names give the same file name, e.g. ``k9/main`` and
    ``k9_main``, or a directory recorded into before) the game gets ``...-<game:04d>-2.json``,
    ``-3``, ..., the first name free. Returns the paths written.

    Raises ReplayError naming the directory if it cannot be written.
    """
    if env_spec(env_name).kind != "aec":
        raise ReplayError(f"replays are recorded for turn-based games; {env_name} is not one")
    directory = Path(directory)
    paths = []
    tmp = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for k, record in enumerate(records):
            stem = f"{_safe(players[0])}-vs-{_safe(players[1])}-{k:04d}"
            text = json.dumps(asdict(make_replay(env_name, players, record))) + "\n"
            tmp = directory / f".{stem}.{uuid.uuid4().hex}.json.tmp"  # unique: workers may share the directory
            with open(tmp, "x") as f:
                f.write(text)
            counter = 1
            path = directory / f"{stem}.json"
            while not _create(tmp, path, text):
                counter += 1
                path = directory / f"{stem}-{counter}.json"
            tmp.unlink()
            tmp = None
            paths.append(path)
    except OSError as e:
        raise ReplayError(f"cannot write replays to {directory}: {e.strerror}") from None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    return paths


_FIELD_TYPES = {"format": int, "env": str, "env_version": str, "pettingzoo": str, "seed": int, "seats": list,
                "players": list, "actions": list, "rewards": list, "length": int}


def load_replay(path: str | Path) -> Replay:
    """Read a replay file and check its structure (not yet its game: see `simulate`).

    Raises:
      ReplayError naming the file: unreadable, not JSON, another format version, or a field
        missing or of the wrong type.
    """
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise ReplayError(f"{path}: cannot read the replay: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ReplayError(f"{path}: not a JSON replay: {e}") from None
    if not isinstance(data, dict):
        raise ReplayError(f"{path}: not a replay (expected a JSON object)")
    if data.get("format") != REPLAY_FORMAT:
        raise ReplayError(f"{path}: replay format {data.get('format')!r}; this build reads format {REPLAY_FORMAT}")
    for key, kind in _FIELD_TYPES.items():
        if not isinstance(data.get(key), kind) or isinstance(data.get(key), bool):
            raise ReplayError(f"{path}: field {key!r} is missing or not a {kind.__name__}")
    if "winner" not in data or not (data["winner"] is None or type(data["winner"]) is int):
        raise ReplayError(f"{path}: field 'winner' must be a seat number or null (draw)")
    if not all(isinstance(s, str) for s in data["seats"]):
        raise ReplayError(f"{path}: 'seats' must be a list of strings")
    if not all(isinstance(p, str) for p in data["players"]):
        raise ReplayError(f"{path}: 'players' must be a list of strings (display names)")
    if not all(type(a) is int for a in data["actions"]):
        raise ReplayError(f"{path}: 'actions' must be a list of integers")
    if not all(isinstance(r, (int, float)) and not isinstance(r, bool) for r in data["rewards"]):
        raise ReplayError(f"{path}: 'rewards' must be a list of numbers")
    unknown = set(data) - set(_FIELD_TYPES) - {"winner"}
    if unknown:
        raise ReplayError(f"{path}: unknown fields {sorted(unknown)}")
    return Replay(**data)


@dataclass
class Position:
    """The game after `move` actions (0 = the start): seat-0 view of the board, and who just played.

    observation: seat 0's observation (channel 0 = seat 0's pieces, channel 1 = seat 1's).
    frame: uint8 ``[H, W, 3]`` render, when rendering was asked for.
    """

    move: int
    seat: int | None
    action: int | None
    observation: np.ndarray
    frame: np.ndarray | None = None


def simulate(replay: Replay, path: str | Path, render: bool = False) -> list[Position]:
    """Re-play `replay` in its env and check it; returns the start and the position after each move.

    Rewards are summed the way `envs/aec.py` does: each agent's accumulated reward as `last()`
    reports it when the agent is next selected (the loser learns of its loss then).

    Args:
      replay: as read by `load_replay`.
      path: the file it came from, for error messages.
      render: also render each position as an RGB frame (`Position.frame`).

    Raises:
      ReplayError naming `path`: unknown env or another env version than this build's, seats,
        players or rewards that are not one per seat of the env, an illegal or out-of-range action,
        a game that ends before or after the recorded actions, or rewards, winner or length that
        differ from the recorded ones.
    """
    try:
        spec = env_spec(replay.env)
    except ValueError as e:
        raise ReplayError(f"{path}: {e}") from None
    if replay.env_version != spec.version:
        raise ReplayError(f"{path}: recorded with {replay.env_version}, but this build plays {replay.env} "
                          f"as {spec.version}; it cannot be re-simulated faithfully")
    if replay.length != len(replay.actions):
        raise ReplayError(f"{path}: 'length' is {replay.length} but {len(replay.actions)} actions are recorded")
    if list(replay.seats) != list(spec.seats):
        raise ReplayError(f"{path}: seats {replay.seats} do not match the env's agents {list(spec.seats)}")
    for key in ("players", "rewards"):
        if len(getattr(replay, key)) != len(spec.seats):
            raise ReplayError(f"{path}: {key!r} has {len(getattr(replay, key))} entries; {replay.env} has "
                              f"{len(spec.seats)} seats ({', '.join(spec.seats)}), one entry each")
    if render:
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame draws off-screen; no display needed
    env = make_raw_env(replay.env, render_mode="rgb_array" if render else None)
    env.reset(seed=replay.seed)
    seats = list(env.possible_agents)
    if seats != replay.seats:
        raise ReplayError(f"{path}: seats {replay.seats} do not match the env's agents {seats}")
    returns = [0.0] * len(seats)

    def position(move: int, seat: int | None, action: int | None) -> Position:
        return Position(move, seat, action, np.array(env.observe(seats[0])["observation"]),
                        np.asarray(env.render()) if render else None)

    positions = [position(0, None, None)]
    played = 0
    for agent in env.agent_iter():
        observation, reward, terminated, truncated, _ = env.last()
        seat = seats.index(agent)
        returns[seat] += float(reward)
        if terminated or truncated:
            env.step(None)
            continue
        if played == len(replay.actions):
            raise ReplayError(f"{path}: the game is not over after the {played} recorded actions")
        action = replay.actions[played]
        if not 0 <= action < spec.num_actions or not observation["action_mask"][action]:
            raise ReplayError(f"{path}: action {played + 1} ({action}, by {agent}) is illegal in that position")
        env.step(action)
        played += 1
        positions.append(position(played, seat, action))
    if played != len(replay.actions):
        raise ReplayError(f"{path}: the game ended after {played} actions but {len(replay.actions)} are recorded")
    if len(returns) != len(replay.rewards) or not all(np.isclose(r, recorded)
                                                      for r, recorded in zip(returns, replay.rewards)):
        raise ReplayError(f"{path}: re-simulated rewards {returns} differ from the recorded {replay.rewards}")
    best = max(returns)
    leaders = [s for s, r in enumerate(returns) if r == best]
    winner = leaders[0] if len(leaders) == 1 else None
    if winner != replay.winner:
        raise ReplayError(f"{path}: re-simulated outcome ({describe_winner(replay, winner)}) differs from the "
                          f"recorded one ({describe_winner(replay, replay.winner)})")
    env.close()
    return positions


def describe_winner(replay: Replay, winner: int | None) -> str:
    """"draw" or "<seat agent> (<player>) won"."""
    if winner is None:
        return "draw"
    if not 0 <= winner < len(replay.seats):
        return f"seat {winner} won"
    return f"{replay.seats[winner]} ({replay.players[winner]}) won"


_PIECES = {0: ".", 1: "X", 2: "O"}


def ascii_board(env_name: str, observation: np.ndarray) -> str:
    """The board of a grid game as text: X = seat 0, O = seat 1, . = empty.

    observation: seat 0's int8 ``[rows, cols, 2]`` observation. Connect four gets its column
    numbers (the actions) under the board; tic-tac-toe shows the action number of empty cells.

    Raises ValueError if the env has no board model (see `evaluation.bots.GAMES`).
    """
    if env_name not in GAMES:
        raise ValueError(f"no text board for env {env_name!r}; boards exist for {sorted(GAMES)}")
    game = GAMES[env_name]
    cells = observation[..., 0] + 2 * observation[..., 1]
    lines = []
    for row in range(game.rows):
        marks = []
        for col in range(game.cols):
            mark = _PIECES[int(cells[row, col])]
            if mark == "." and not game.gravity:
                mark = str(row * game.cols + col)
            marks.append(mark)
        lines.append(" ".join(marks))
    if game.gravity:
        lines.append(" ".join(str(c) for c in range(game.cols)))
    return "\n".join(lines)


def describe_move(replay: Replay, position: Position) -> str:
    """E.g. "move 3/13: player_0 (minimax:2) plays 4"; "start" for the initial position."""
    if position.seat is None:
        return f"start: {replay.players[0]} (X, {replay.seats[0]}) vs {replay.players[1]} (O, {replay.seats[1]})"
    return (f"move {position.move}/{replay.length}: {replay.seats[position.seat]} "
            f"({replay.players[position.seat]}) plays {position.action}")


def check_gif_path(path: str | Path) -> Path:
    """`path` as a GIF to write: call before replaying, so a bad ``--gif`` fails before any output.

    Raises ReplayError naming the path if its name does not end in ``.gif``, it is a directory, or
    its directory does not exist.
    """
    path = Path(path)
    if path.is_dir():
        raise ReplayError(f"cannot write the GIF {path}: it is a directory")
    if path.suffix.lower() != ".gif":
        raise ReplayError(f"cannot write the GIF {path}: the file name must end in .gif")
    parent = path.parent
    if not parent.is_dir():
        raise ReplayError(f"cannot write the GIF {path}: no directory {parent}")
    return path


def write_gif(frames: list[np.ndarray], path: str | Path) -> None:
    """Write uint8 ``[H, W, 3]`` frames as a looping GIF, one frame per position.

    Frames are scaled by `GIF_SCALE`; each is shown `GIF_FRAME_MS` ms, the last one three times
    as long. Raises ReplayError if `path` fails `check_gif_path` or the file cannot be written.
    """
    from PIL import Image

    path = check_gif_path(path)

    images = []
    for frame in frames:
        image = Image.fromarray(frame)
        size = (max(1, round(image.width * GIF_SCALE)), max(1, round(image.height * GIF_SCALE)))
        images.append(image.resize(size, Image.Resampling.LANCZOS))
    durations = [GIF_FRAME_MS] * (len(images) - 1) + [3 * GIF_FRAME_MS]
    try:
        images[0].save(path, format="GIF", save_all=True, append_images=images[1:], duration=durations, loop=0)
    except OSError as e:
        raise ReplayError(f"cannot write the GIF {path}: {e.strerror or e}") from None
