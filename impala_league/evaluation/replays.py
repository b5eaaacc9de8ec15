"""Game replays: one small JSON file per game, re-simulated and checked before it is shown.

Format (version ``REPLAY_FORMAT``)::

    {"format": 2, "env": "connect_four", "env_version": "connect_four_v3", "pettingzoo": "1.27.0",
     "seed": 17, "seats": ["player_0", "player_1"], "players": ["minimax:2", "random"],
     "actions": [3, 3, 4, ...], "rewards": [1.0, -1.0], "winner": 0, "length": 13, "kwargs": {}}

``seed`` is the env's reset seed, ``players[s]`` the display name of the player in seat ``s``
(seat 0 moves first), ``rewards`` the summed reward per seat (over the seat's agents), ``winner``
the winning seat by the env's rule or null for a draw, ``kwargs`` the env's constructor arguments
(a battle's ``map_size``, ``max_cycles``), ``env_seats`` (only where the run's config declared
``env.seats``: the agents of each seat, e.g. ``[["agent_1"], ["agent_0"]]``). In a turn-based game
``actions`` holds every move in order of play and ``length`` their number; in a simultaneous-move
game (a battle, MPE) or a one-agent gymnasium env ``actions`` holds, step after step, one action per
acting agent in ``env.agents`` order, and ``length`` counts env steps. Format 1 (no ``kwargs``: the env's defaults) is still read.

A replay is trusted only after ``simulate`` has replayed it in the same env (same versioned module,
kwargs and seed): every recorded action must be legal where it is played, the game must end exactly
after the last one, and rewards, winner and length must match. JSON only: nothing is unpickled.
"""

from __future__ import annotations

import errno
import json
import os
import re
import math
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from impala_league.config import UserError
from impala_league.envs.base import leader
from impala_league.envs.registry import EnvSpec, env_spec, make_env, make_raw_env
from impala_league.evaluation.bots import GAMES

REPLAY_FORMAT = 2
"""Version of the replay file format written by this module."""
READ_FORMATS = (1, 2)
"""Versions this module reads (format 1: no ``kwargs`` field)."""

GIF_SIDE = 448
"""GIF frames are the env's render scaled so that their longer side has this many pixels
(connect four: 891 x 774 -> 448 x 389; a 12 x 12 battle: 96 x 112 -> 384 x 448, pixels kept sharp)."""
GIF_FRAME_MS = 600
"""How long each position of a turn-based game is shown in a GIF, in ms (the final one three times longer)."""
GIF_STEP_MS = 100
"""How long each frame of a simultaneous-move game is shown in a GIF, in ms: battles last hundreds of steps."""
GIF_MAX_FRAMES = 250
"""At most about this many frames per simultaneous-move GIF: longer games show every k-th step
(`gif_stride`), always with the start and the final step; 250 frames of 100 ms play in 25 s."""


class ReplayError(UserError, ValueError):
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
    kwargs: dict[str, Any] = field(default_factory=dict)
    env_seats: list[list[str]] | None = None


def _pettingzoo_version() -> str:
    import pettingzoo

    return pettingzoo.__version__


def make_replay(env_name: str, players: tuple[str, ...], record, kwargs: Mapping[str, Any] | None = None,
                seats: list[list[str]] | None = None) -> Replay:
    """The replay of one finished game of `env_name` built with `kwargs` (and declared `seats`, the
    config's `env.seats`).

    record: an `evaluation.evaluate.GameRecord` (seed, actions, returns, winner, length).
    """
    spec = env_spec(env_name, kwargs, seats)
    return Replay(REPLAY_FORMAT, env_name, spec.version or env_name, _pettingzoo_version(), int(record.seed),
                  list(spec.seats), list(players), [int(a) for a in record.actions],
                  [float(r) for r in record.returns], record.winner, int(record.length), dict(kwargs or {}),
                  None if seats is None else [list(seat) for seat in seats])


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


def save_match(directory: str | Path, env_name: str, players: tuple[str, ...], records: Iterable,
               kwargs: Mapping[str, Any] | None = None, seats: list[list[str]] | None = None) -> list[Path]:
    """Save each game of one match of `env_name` (built with `kwargs`) as
    ``<directory>/<seat 0>-vs-<seat 1>-<game:04d>.json`` (``<player>-<game:04d>.json`` in a one-seat env).

    players: display names of the players by seat (characters other than letters,
    digits, ``.``, ``_``, ``-`` become ``_`` in file names). An existing file is never overwritten:
    when the name is taken (two players whose names give the same file name, e.g. ``k9/main`` and
    ``k9_main``, or a directory recorded into before) the game gets ``...-<game:04d>-2.json``,
    ``-3``, ..., the first name free. Returns the paths written.

    Raises ReplayError naming the directory if it cannot be written.
    """
    directory = Path(directory)
    paths = []
    tmp = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for k, record in enumerate(records):
            stem = f"{'-vs-'.join(_safe(p) for p in players)}-{k:04d}"
            replay = asdict(make_replay(env_name, players, record, kwargs, seats))
            if replay["env_seats"] is None:  # seats inferred from the env: files as before
                del replay["env_seats"]
            text = json.dumps(replay) + "\n"
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
      ReplayError naming the file: unreadable, not JSON, a format version not in `READ_FORMATS`, or
        a field missing or of the wrong type.
    """
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise ReplayError(f"{path}: cannot read the replay: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ReplayError(f"{path}: not a JSON replay: {e}") from None
    if not isinstance(data, dict):
        raise ReplayError(f"{path}: not a replay (expected a JSON object)")
    if data.get("format") not in READ_FORMATS or isinstance(data.get("format"), bool):
        raise ReplayError(f"{path}: replay format {data.get('format')!r}; this build reads formats "
                          f"{', '.join(map(str, READ_FORMATS))}")
    fields = dict(_FIELD_TYPES, kwargs=dict) if data["format"] >= 2 else _FIELD_TYPES
    for key, kind in fields.items():
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
    if "env_seats" in data and not (isinstance(data["env_seats"], list) and all(
            isinstance(seat, list) and all(isinstance(a, str) for a in seat) for seat in data["env_seats"])):
        raise ReplayError(f"{path}: 'env_seats' must be a list of seats, each a list of agent names")
    unknown = set(data) - set(fields) - {"winner", "env_seats"}
    if unknown:
        raise ReplayError(f"{path}: unknown fields {sorted(unknown)}")
    return Replay(**data)


@dataclass
class Position:
    """The game after `move` actions (turn-based) or `move` env steps (simultaneous); 0 = the start.

    seat, action: who just played what (turn-based games; None at the start and in simultaneous games).
    observation: turn-based games: seat 0's observation (channel 0 = seat 0's pieces, channel 1 = seat 1's).
    frame: uint8 ``[H, W, 3]`` render, when rendering was asked for (in a simultaneous game only at
      the start, every `gif_stride`-th step and the final step).
    units: simultaneous games: agents alive per seat (a terminated unit is dead; at a time limit the
      standing units count, as in the env's outcome rule).
    returns: simultaneous games: reward so far per seat, summed over the seat's agents.
    """

    move: int
    seat: int | None
    action: int | None
    observation: np.ndarray | None
    frame: np.ndarray | None = None
    units: tuple[int, ...] | None = None
    returns: tuple[float, ...] | None = None


def simulate(replay: Replay, path: str | Path, render: bool = False) -> list[Position]:
    """Re-play `replay` in its env (built with its kwargs) and check it; returns the start and the
    position after each move (turn-based) or env step (simultaneous, one-agent).

    Turn-based rewards are summed the way `envs/aec.py` does: each agent's accumulated reward as
    `last()` reports it when the agent is next selected (the loser learns of its loss then).
    Simultaneous and one-agent games are re-played through the same adapter (`envs.registry.make_env`)
    that played them, so returns, winner (the env's outcome rule, e.g. units left) and length are
    computed by the code that recorded them.

    Args:
      replay: as read by `load_replay`.
      path: the file it came from, for error messages.
      render: also render positions as RGB frames (`Position.frame`).

    Raises:
      ReplayError naming `path`: unknown env or kwargs, another env version than this build's, seats,
        players or rewards that are not one per seat of the env, an illegal or out-of-range action,
        a game that ends before or after the recorded actions, or rewards, winner or length that
        differ from the recorded ones; `render` for a one-agent gymnasium env.
    """
    try:
        spec = env_spec(replay.env, replay.kwargs, replay.env_seats)
    except ValueError as e:
        raise ReplayError(f"{path}: {e}") from None
    except AssertionError as e:  # MAgent2 checks its arguments with assert (e.g. map_size >= 12)
        raise ReplayError(f"{path}: env {replay.env!r} refuses env.kwargs {replay.kwargs}: {e}") from None
    if replay.env_version != spec.version:
        raise ReplayError(f"{path}: recorded with {replay.env_version}, but this build plays {replay.env} "
                          f"as {spec.version}; it cannot be re-simulated faithfully")
    if list(replay.seats) != list(spec.seats):
        raise ReplayError(f"{path}: seats {replay.seats} do not match the env's seats {list(spec.seats)}")
    for key in ("players", "rewards"):
        if len(getattr(replay, key)) != len(spec.seats):
            raise ReplayError(f"{path}: {key!r} has {len(getattr(replay, key))} entries; {replay.env} has "
                              f"{len(spec.seats)} seats ({', '.join(spec.seats)}), one entry each")
    if render:
        if spec.kind == "gym":
            raise ReplayError(f"{path}: GIFs are drawn for PettingZoo games; {replay.env} is a gymnasium env")
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame draws off-screen; no display needed
    if spec.kind == "aec":
        positions, returns, winner = _simulate_turns(replay, path, spec, render)
    else:
        positions, returns, winner = _simulate_steps(replay, path, spec, render)
    if not all(np.isclose(r, recorded) for r, recorded in zip(returns, replay.rewards)):
        raise ReplayError(f"{path}: re-simulated rewards {list(returns)} differ from the recorded {replay.rewards}")
    if winner != replay.winner:
        raise ReplayError(f"{path}: re-simulated outcome ({describe_winner(replay, winner)}) differs from the "
                          f"recorded one ({describe_winner(replay, replay.winner)})")
    return positions


def _simulate_turns(replay: Replay, path: str | Path, spec: EnvSpec, render: bool):
    """A turn-based game re-played move by move: (positions, returns per seat, winner)."""
    if replay.length != len(replay.actions):
        raise ReplayError(f"{path}: 'length' is {replay.length} but {len(replay.actions)} actions are recorded")
    env = make_raw_env(replay.env, "rgb_array" if render else None, replay.kwargs)
    env.reset(seed=replay.seed)
    seats = list(env.possible_agents)
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
    env.close()
    if played != len(replay.actions):
        raise ReplayError(f"{path}: the game ended after {played} actions but {len(replay.actions)} are recorded")
    return positions, returns, leader(returns)


def gif_stride(steps: int) -> int:
    """k such that a GIF of a `steps`-step simultaneous game shows the start, every k-th step and
    the final step: at most about `GIF_MAX_FRAMES` frames."""
    return max(1, math.ceil(steps / GIF_MAX_FRAMES))


class _Watch:
    """The env an adapter drives, watched from outside: after each step it notes the agents alive
    and the rewards so far per seat, and (with `stride`) renders every `stride`-th and the final step.

    Wraps the adapter's env in place; only the episode it starts in is watched.
    """

    def __init__(self, env: Any, spec: EnvSpec, stride: int | None):
        self.env = env
        self._seat = dict(zip(spec.agents, spec.agent_seats))
        self._stride = stride
        self._alive = set(env.agents)
        self._returns = [0.0] * len(spec.seats)
        self.positions: list[Position] = []
        self._note(final=False)

    def __getattr__(self, name: str):
        return getattr(self.env, name)

    def step(self, actions: dict):
        out = self.env.step(actions)
        for agent, reward in out[1].items():
            self._returns[self._seat[agent]] += float(reward)
        self._alive -= {agent for agent, terminated in out[2].items() if terminated}
        self._note(final=not self.env.agents)
        return out

    def _note(self, final: bool) -> None:
        move = len(self.positions)
        units = [0] * len(self._returns)
        for agent in self._alive:
            units[self._seat[agent]] += 1
        shown = self._stride is not None and (final or move % self._stride == 0)
        frame = np.asarray(self.env.render()) if shown else None
        self.positions.append(Position(move, None, None, None, frame, tuple(units), tuple(self._returns)))


def _simulate_steps(replay: Replay, path: str | Path, spec: EnvSpec, render: bool):
    """A simultaneous-move or one-agent game re-played step by step through its adapter:
    (positions, returns per seat, winner)."""
    adapter = make_env(replay.env, replay.seed, replay.kwargs, "rgb_array" if render else None, replay.env_seats)
    watch = _Watch(adapter.env, spec, gif_stride(replay.length) if render else None)
    adapter.env = watch
    try:
        step = adapter.advance()
        played = 0
        while not step.episodes:
            n = len(step.agents)
            if played + n > len(replay.actions):
                raise ReplayError(f"{path}: the game is not over after the {len(replay.actions)} recorded actions "
                                  f"(step {len(watch.positions)} needs {n}, {len(replay.actions) - played} are left)")
            actions = replay.actions[played:played + n]
            for j, (agent, action) in enumerate(zip(step.agents, actions)):
                if not 0 <= action < spec.num_actions or not step.action_masks[j][action]:
                    raise ReplayError(f"{path}: action {played + j + 1} ({action}, by {spec.agents[agent]} at "
                                      f"step {len(watch.positions)}) is illegal there")
            adapter.act(actions)
            played += n
            step = adapter.advance()
    finally:
        getattr(watch.env, "close", lambda: None)()  # the one-agent wrapper has none
    episode = step.episodes[0]
    if played != len(replay.actions):
        raise ReplayError(f"{path}: the game ended after {episode.length} steps ({played} actions) but "
                          f"{len(replay.actions)} actions are recorded")
    if episode.length != replay.length:
        raise ReplayError(f"{path}: the game lasted {episode.length} steps but 'length' is {replay.length}")
    if episode.units_left is not None:  # the game's own count at the end (see envs/parallel.py)
        watch.positions[-1] = replace(watch.positions[-1], units=episode.units_left)
    return watch.positions, episode.returns, episode.winner


def describe_winner(replay: Replay, winner: int | None) -> str:
    """"draw" or "<seat agent> (<player>) won"."""
    if winner is None:
        return "draw"
    if not 0 <= winner < len(replay.seats):
        return f"seat {winner} won"
    return f"{replay.seats[winner]} ({replay.players[winner]}) won"


_PIECES = {0: ".", 1: "X", 2: "O"}
_DRAWN_TRANSPOSED = {"tictactoe"}
"""Games whose observation rows are drawn as columns by the env's renderer (see `ascii_board`)."""


def ascii_board(env_name: str, observation: np.ndarray) -> str:
    """The board of a grid game as text: X = seat 0, O = seat 1, . = empty.

    observation: seat 0's int8 ``[rows, cols, 2]`` observation. Connect four gets its column
    numbers (the actions) under the board; tic-tac-toe shows the action number of empty cells.
    The board is drawn as the env renders it (the GIF): PettingZoo's tic-tac-toe numbers its cells
    column by column (0 3 6 / 1 4 7 / 2 5 8) and draws cell a in column a // 3, row a % 3, so
    observation row r is drawn as column r (`_DRAWN_TRANSPOSED`).

    Raises ValueError if the env has no board model (see `evaluation.bots.GAMES`).
    """
    if env_name not in GAMES:
        raise ValueError(f"no text board for env {env_name!r}; boards exist for {sorted(GAMES)}")
    game = GAMES[env_name]
    cells = observation[..., 0] + 2 * observation[..., 1]
    action = np.arange(game.rows * game.cols).reshape(game.rows, game.cols)  # observation cell -> its action
    if env_name in _DRAWN_TRANSPOSED:
        cells, action = cells.T, action.T
    lines = []
    for row in range(cells.shape[0]):
        marks = []
        for col in range(cells.shape[1]):
            mark = _PIECES[int(cells[row, col])]
            if mark == "." and not game.gravity:
                mark = str(action[row, col])
            marks.append(mark)
        lines.append(" ".join(marks))
    if game.gravity:
        lines.append(" ".join(str(c) for c in range(game.cols)))
    return "\n".join(lines)


def describe_move(replay: Replay, position: Position) -> str:
    """E.g. "move 3/13: player_0 (minimax:2) plays 4"; "start" for the initial position. In a
    simultaneous game, units left and reward so far per seat, e.g.
    "step 7/30: red (run/main) 2 units, return 0.35 | blue (random) 1 units, return -0.80"."""
    if position.units is not None:
        seats = " | ".join(f"{seat} ({player}) {units} units, return {ret:.2f}" for seat, player, units, ret
                           in zip(replay.seats, replay.players, position.units, position.returns or ()))
        return f"step {position.move}/{replay.length}: {seats}"
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


def write_gif(frames: list[np.ndarray], path: str | Path, frame_ms: int = GIF_FRAME_MS) -> None:
    """Write uint8 ``[H, W, 3]`` frames as a looping GIF, one frame per position.

    Frames are scaled so that their longer side is `GIF_SIDE` pixels (enlarged ones without
    smoothing, so a battle's grid cells stay sharp); each is shown `frame_ms` ms, the last one three
    times as long. Consecutive identical frames are merged into one shown for their summed time.
    Raises ReplayError if `path` fails `check_gif_path` or the file cannot be written.
    """
    from PIL import Image

    path = check_gif_path(path)

    images = []
    for frame in frames:
        image = Image.fromarray(frame)
        scale = GIF_SIDE / max(image.width, image.height)
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        if scale < 1:
            images.append(image.resize(size, Image.Resampling.LANCZOS, reducing_gap=2.0))
        else:  # palette first: quantizing the small frame is what keeps long GIFs fast to write
            images.append(image.convert("P", palette=Image.Palette.ADAPTIVE).resize(size, Image.Resampling.NEAREST))
    durations = [frame_ms] * (len(images) - 1) + [3 * frame_ms]
    try:
        images[0].save(path, format="GIF", save_all=True, append_images=images[1:], duration=durations, loop=0)
    except OSError as e:
        raise ReplayError(f"cannot write the GIF {path}: {e.strerror or e}") from None
