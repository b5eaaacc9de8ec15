"""Multi-player Atari 2600 games of PettingZoo (`pettingzoo.atari.<game>_vN`, on `multi-agent-ale-py`).

`atari2p:<game>` (e.g. `atari2p:boxing`, `atari2p:pong`) is PettingZoo's newest `<game>_vN` Parallel env,
every player seeing the frames that `atari:<Game>` (envs/atari.py) shows its one player: the steps of
gymnasium's `AtariPreprocessing` and `FrameStackObservation`, done here for all players at once
(`Preprocessed`), since SuperSuit's wrappers resize with nearest or bilinear interpolation (tinyscaler),
stack channels last and have no no-op starts:

* sticky actions at 0.25 (`sticky_actions`, in [0, 1); 0 turns them off), Machado et al.'s and `atari:`'s;
* the minimal action set of the game (`full_action_space` for all 18);
* a frame skip of 4: the players' actions are repeated 4 frames, the observation is the max over the
  last two frames, each player's rewards are summed; the skip stops early at a frame where a player's
  game ends or the time limit is reached (gymnasium's wrapper does the same), and the observation is
  then the screen after that frame (`envs.atari.read_end_screens`);
* ALE's grayscale screen, resized to 84 x 84 with OpenCV's area interpolation, uint8;
* a stack of the last 4 frames, channels first; at a reset the stack holds the first frame 4 times;
* up to 30 no-op frames at the start of each episode (both players play NOOP; the number is drawn
  from the episode's seed);
* `max_cycles`: PettingZoo's time limit, counted as PettingZoo counts its steps, in emulator frames
  (no-op starts included); 108,000 (30 minutes of play) as atari:'s `max_episode_frames`. Reaching
  it ends the episode for every player as truncated (the learner bootstraps);
* `agent_indicator` (on by default): every player sees the same screen, so a network that plays both
  sides could not tell which one it controls; one plane per player is added after the frames, 255 on
  the plane of the player who sees it and 0 elsewhere (SuperSuit's `agent_indicator_v0`, which
  CleanRL's PettingZoo Atari agents use). The observation is uint8 [frame_stack + players, 84, 84];
  without the indicator it is [frame_stack, 84, 84], as atari:'s.
* `mirrored_players` (none by default): the players whose frames are flipped left to right, so that in a
  game that is the same seen from either side every player sees itself on one side. In Pong
  (`[second_0]`) both paddles are then the right one, the one-player game's own, and one network learns
  one game instead of two. The actions are not changed: it fits games whose actions do not move
  left or right on the screen (Pong's paddles move up and down).

The ROMs are those of the `ale-py` wheel (`auto_rom_install_path`): nothing is downloaded. Players are
PettingZoo's `first_0`, `second_0` (`third_0`, `fourth_0` in the four-player games): each its own seat
(envs/registry.py reads `first`, `second` as their teams). Rewards are the game's score changes,
unclipped. Other keyword arguments of a game's own `raw_env` (e.g. pong's `game_version`) pass through.

An actor's games (`envs.registry.make_envs`) are stepped by one `envs.atari2p_vector.Atari2pGroup`, which
plays each game as this env under `envs.parallel.ParallelAdapter` does, with less Python around each
emulator frame (PettingZoo's `step` and multi_agent_ale_py's array conversions are left out); `make_env`
(evaluation, replays, rendering) steps this env.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import pkgutil
import re
from collections import deque
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding

from impala_league.envs.atari import check_sticky_actions, read_end_screens

PACKAGES = ("multi-agent-ale-py, ale-py (its ROMs) and opencv-python-headless (in requirements.txt: "
            "bash scripts/bootstrap.sh installs them)")
DEFAULTS = dict(frame_stack=4, frame_skip=4, noop_max=30, screen_size=84, sticky_actions=0.25,
                max_cycles=108_000, full_action_space=False, agent_indicator=True, mirrored_players=())
NOOP = 0  # ALE's action index of NOOP


def _atari_package():
    try:
        import pettingzoo.atari
    except ImportError as e:
        raise ValueError(f"atari2p:<game> needs pettingzoo: {e}") from None
    return pettingzoo.atari


def games() -> dict[str, str]:
    """Every game `atari2p:<game>` takes, with its newest module: {'boxing': 'boxing_v2', ...}."""
    newest: dict[str, tuple[int, str]] = {}
    for m in pkgutil.iter_modules(_atari_package().__path__):
        found = re.fullmatch(r"(\w+)_v(\d+)", m.name)
        if found and newest.get(found[1], (-1, ""))[0] < int(found[2]):
            newest[found[1]] = (int(found[2]), m.name)
    return {game: module for game, (_, module) in sorted(newest.items())}


def module_name(game: str) -> str:
    """`<game>_vN` (the newest N), or a ValueError naming the closest games and the valid ones."""
    known = games()
    if game in known:
        return known[game]
    close = difflib.get_close_matches(game.lower(), list(known), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(f'atari2p:{c}' for c in close)}? " if close else ""
    raise ValueError(f"unknown PettingZoo Atari game '{game}'; {hint}valid: {', '.join(known)}")


def _module(game: str):
    name = module_name(game)
    try:
        import cv2  # noqa: F401  (frames are resized with it)
        import ale_py.roms  # noqa: F401  (the ROMs)
        return importlib.import_module(f"pettingzoo.atari.{name}")
    except ImportError as e:
        raise ValueError(f"atari2p:{game} needs {PACKAGES}: {e}") from None


def game_options(game: str) -> dict[str, Any]:
    """The keyword arguments of the game's own `raw_env` (e.g. pong's `num_players`, `game_version`),
    with their defaults."""
    params = inspect.signature(_module(game).raw_env).parameters.values()
    return {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD}


def settings(game: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """DEFAULTS and the game's own options, updated with the config's env.kwargs; a ValueError names an
    unknown key or a bad value."""
    options = game_options(game)
    unknown = sorted(set(kwargs) - set(DEFAULTS) - set(options))
    if unknown:
        own = f"; atari2p:{game}'s own: {', '.join(options)}" if options else ""
        raise ValueError(f"atari2p:{game} does not take env.kwargs {unknown}; it takes {', '.join(DEFAULTS)}{own}")
    out = {**DEFAULTS, **kwargs}
    for key in ("frame_stack", "frame_skip", "screen_size", "max_cycles"):
        if not isinstance(out[key], int) or isinstance(out[key], bool) or out[key] < 1:
            raise ValueError(f"env.kwargs.{key} must be an integer >= 1, got {out[key]!r}")
    if not isinstance(out["noop_max"], int) or isinstance(out["noop_max"], bool) or out["noop_max"] < 0:
        raise ValueError(f"env.kwargs.noop_max must be an integer >= 0, got {out['noop_max']!r}")
    check_sticky_actions(out["sticky_actions"])
    for key in ("full_action_space", "agent_indicator"):
        if not isinstance(out[key], bool):
            raise ValueError(f"env.kwargs.{key} must be true or false, got {out[key]!r}")
    mirrored = out["mirrored_players"]
    if isinstance(mirrored, (str, bytes)) or not isinstance(mirrored, Sequence) \
            or not all(isinstance(a, str) for a in mirrored):
        raise ValueError(f"env.kwargs.mirrored_players must be a list of player names (e.g. [second_0]), "
                         f"got {mirrored!r}")
    out["mirrored_players"] = tuple(mirrored)
    return out


def make_atari2p(game: str, kwargs: dict[str, Any], render_mode: Optional[str] = None) -> "Preprocessed":
    """The Parallel env of `atari2p:<game>` with `settings(game, kwargs)`: per player, observations uint8
    [frame_stack (+ players), screen_size, screen_size] and Discrete(minimal action set).

    Raises ValueError for an unknown game (naming the closest), bad kwargs, or a missing package."""
    s = settings(game, kwargs)
    module = _module(game)
    import ale_py.roms

    own = {k: v for k, v in kwargs.items() if k not in DEFAULTS}
    extra = {} if render_mode is None else {"render_mode": render_mode}
    # raw_env is PettingZoo's ParallelAtariEnv under its parallel-to-AEC converter: take the Parallel env
    # itself (the module's parallel_env would convert it back through the AEC checking wrappers).
    raw = module.raw_env(obs_type="ram", full_action_space=s["full_action_space"], max_cycles=s["max_cycles"],
                         auto_rom_install_path=os.path.dirname(ale_py.roms.__file__), **own, **extra).unwrapped
    return Preprocessed(raw, s)


def indicator_planes(players: list[str], player: str, size: int) -> np.ndarray:
    """`agent_indicator`'s planes of `player`: uint8 [len(players), size, size], 255 on the plane of
    `player` (its index in `players`, PettingZoo's `possible_agents`) and 0 on the others. They follow the
    frames in the observation; evaluation/atari_judge.py adds them to the one-player game's frames."""
    planes = np.zeros((len(players), size, size), np.uint8)
    planes[players.index(player)] = 255
    return planes


def ale_seed(seed: int) -> int:
    """The ALE's `random_seed` for an episode seed: the seed itself where it is in [1, 2**31 - 1] (as
    PettingZoo's `reset(seed)` passes it), else `seed % (2**31 - 1) + 1`. The ALE seeds its sticky actions
    from the clock when `random_seed` is 0, so `reset(seed=0)` replayed differently each second."""
    seed = int(seed)
    return seed if 0 < seed < 2**31 else seed % (2**31 - 1) + 1


class Preprocessed:
    """gymnasium's AtariPreprocessing + FrameStackObservation over a PettingZoo `ParallelAtariEnv`, for
    all its players at once (they share the screen), as a PettingZoo Parallel env. See the module's
    docstring for what a step does; `settings` is `settings(game, kwargs)`'s dict."""

    def __init__(self, raw: Any, settings: dict[str, Any]):
        self.raw = raw
        self.frame_skip = settings["frame_skip"]
        self.noop_max = settings["noop_max"]
        self.size = settings["screen_size"]
        self.sticky = float(settings["sticky_actions"])
        self.possible_agents = list(raw.possible_agents)
        self.agents: list[str] = []
        self.metadata = raw.metadata
        self.render_mode = raw.render_mode
        if self.noop_max > 0 and int(raw.action_mapping[0]) != NOOP:
            raise ValueError(f"{raw.metadata['name']}: action 0 is not NOOP, so it cannot have no-op starts: "
                             "set env.kwargs.noop_max=0")
        if self.sticky:  # PettingZoo sets 0; the ALE reads it when a ROM is loaded
            raw.ale.setFloat(b"repeat_action_probability", self.sticky)
            self._load_rom()
        width, height = raw.ale.getScreenDims()
        self._buffer = [np.zeros((height, width), np.uint8), np.zeros((height, width), np.uint8)]
        self._frames: deque[np.ndarray] = deque(maxlen=settings["frame_stack"])
        planes = settings["frame_stack"] + (len(self.possible_agents) if settings["agent_indicator"] else 0)
        self._indicators = {agent: indicator_planes(self.possible_agents, agent, self.size)
                            for agent in self.possible_agents} if settings["agent_indicator"] else {}
        unknown = [a for a in settings["mirrored_players"] if a not in self.possible_agents]
        if unknown:
            raise ValueError(f"env.kwargs.mirrored_players: {raw.metadata['name']} has no player "
                             f"{', '.join(unknown)}; its players: {', '.join(self.possible_agents)}")
        self.mirrored = set(settings["mirrored_players"])
        self._space = spaces.Box(0, 255, (planes, self.size, self.size), np.uint8)

    def observation_space(self, agent: str) -> spaces.Box:
        return self._space

    def action_space(self, agent: str) -> spaces.Discrete:
        return self.raw.action_space(agent)

    @property
    def unwrapped(self) -> Any:
        return self.raw

    def _frame(self) -> np.ndarray:
        """AtariPreprocessing._get_obs: the max of the two buffered screens, resized."""
        import cv2

        if self.frame_skip > 1:
            np.maximum(self._buffer[0], self._buffer[1], out=self._buffer[0])
        return cv2.resize(self._buffer[0], (self.size, self.size), interpolation=cv2.INTER_AREA)

    def _observe(self, agents: list[str]) -> dict[str, np.ndarray]:
        frames = np.stack(self._frames)
        seen = {agent: frames[:, :, ::-1] if agent in self.mirrored else frames for agent in agents}
        if not self._indicators:
            return {agent: seen[agent].copy() for agent in agents}  # C-contiguous, flipped or not
        return {agent: np.concatenate([seen[agent], self._indicators[agent]]) for agent in agents}

    def _load_rom(self) -> None:
        """Reload the game, so that the ALE reads its settings (sticky probability, seed), in its mode."""
        self.raw.ale.loadROM(self.raw.rom_path)
        self.raw.ale.setMode(self.raw.mode)

    def _reset_raw(self, seed: Optional[int], options: Optional[dict]) -> dict:
        """`raw.reset(seed)` with the ALE's seed `ale_seed(seed)`, and without the ROM reload where that
        changes nothing: the ALE reads its seed when a ROM is loaded (0.3 s) and uses it only for sticky
        actions; without them the ALE's reset alone starts the same game. The seed seeds the env's
        generator (the no-op starts) as `raw.reset(seed)` would."""
        if seed is None:
            return self.raw.reset(options=options)[1]
        if self.sticky:
            self.raw.ale.setInt(b"random_seed", ale_seed(seed))
            self._load_rom()
        infos = self.raw.reset(options=options)[1]
        self.raw.np_random, _ = seeding.np_random(seed)
        return infos

    def reset(self, seed: Optional[int] = None, options: Optional[dict] = None):
        """A new game: `raw.reset(seed)` (the ALE's seed is `ale_seed(seed)`), then 1..noop_max NOOP frames
        drawn from the env's generator, which that seed seeds (AtariPreprocessing's no-op reset)."""
        infos = self._reset_raw(seed, options)
        noops = int(self.raw.np_random.integers(1, self.noop_max + 1)) if self.noop_max > 0 else 0
        for _ in range(noops):
            _, _, terminated, truncated, _ = self.raw.step({agent: NOOP for agent in self.raw.agents})
            if any(terminated.values()) or any(truncated.values()) or not self.raw.agents:
                infos = self._reset_raw(seed, options)
        self.raw.ale.getScreenGrayscale(self._buffer[0])
        self._buffer[1].fill(0)
        frame = self._frame()
        self._frames.clear()
        self._frames.extend([frame] * self._frames.maxlen)
        self.agents = list(self.raw.agents)
        return self._observe(self.agents), {agent: dict(infos.get(agent, {})) for agent in self.agents}

    def step(self, actions: dict[str, int]):
        """`frame_skip` frames of `actions` (AtariPreprocessing.step for every player). Players whose game
        ended are terminated; at the time limit every player left is truncated and the episode is over."""
        agents = list(self.agents)
        rewards = dict.fromkeys(agents, 0.0)
        terminated = dict.fromkeys(agents, False)
        truncated = dict.fromkeys(agents, False)
        infos: dict[str, Any] = {}
        for t in range(self.frame_skip):
            _, step_rewards, step_terminated, step_truncated, infos = self.raw.step(actions)
            for agent, reward in step_rewards.items():
                rewards[agent] += float(reward)
            terminated.update({a: bool(v) for a, v in step_terminated.items()})
            truncated.update({a: bool(v) for a, v in step_truncated.items()})
            if any(step_terminated.values()) or any(step_truncated.values()):
                read_end_screens(self.raw.ale, self._buffer, t + 1, self.frame_skip)
                break
            if t == self.frame_skip - 2:
                self.raw.ale.getScreenGrayscale(self._buffer[1])
            elif t == self.frame_skip - 1:
                self.raw.ale.getScreenGrayscale(self._buffer[0])
        self._frames.append(self._frame())
        # PettingZoo's Atari envs leave truncated players in `agents`; a Parallel env's episode ends when
        # none is left, so the time limit removes them all.
        self.agents = [] if any(truncated.values()) else list(self.raw.agents)
        return (self._observe(agents), rewards, terminated, truncated,
                {agent: dict(infos.get(agent, {})) for agent in agents})

    def render(self):
        return self.raw.render()

    def close(self) -> None:
        self.raw.close()
