"""StarCraft II games as `sc2:<map>` envs: minigames (one agent) and melee maps (two agents, or one
agent against the game's built-in bot), under the env contract of envs/base.py.

Settings come from the config's `env.kwargs` (see `SC2Settings`). Every agent acts at every step (a
simultaneous game), each with its own seat. Which reward belongs where:
* *Minigames* (MoveToBeacon, CollectMineralShards, ...): the map's score change since the last step
  (pysc2's reward) settles the step just taken.
* *Melee maps* (Simple64, ...): pysc2's outcome reward, +1 / -1 / 0 on each agent's last step (a
  draw or a time-out gives 0 to both); the seat with the higher return wins.
* *Episode end*: pysc2 marks every agent's last timestep at once; each agent's last step is settled
  with done, the episode's result is recorded, and the game is reset (episodes concatenated).
* *Time limit*: pysc2's own step limit (`game_steps_per_episode`) ends an episode with a nonzero
  discount, the game's end (a `player_result`) with discount 0. The former is settled as truncated
  with the last observation (the learner bootstraps from its value); a limit the map itself enforces
  ends the game, so it reads as the game's end.
* *No legal action*: an agent whose available actions are none raises `NoLegalAction`.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
from pysc2 import maps
from pysc2.env import mock_sc2_env, sc2_env

from impala_league.envs.base import EnvSpec, EpisodeResult, Settlement, Step, check_mask, leader
from impala_league.envs.sc2_wrappers.actions import NUM_FUNCTIONS, FunctionCallCodec
from impala_league.envs.sc2_wrappers.compat import SC2NotInstalledError, require_game
from impala_league.envs.sc2_wrappers.observation import AVAILABLE_ACTIONS, SC2ObservationSpec, encode_observation

PREFIX = "sc2:"
RACES = tuple(sc2_env.Race.__members__)
DIFFICULTIES = tuple(sc2_env.Difficulty.__members__)
AGENT_RACE = "random"  # learners play a random race, so one policy covers all three


@dataclass(frozen=True)
class SC2Settings:
    """The `env.kwargs` of an `sc2:<map>` env (each optional).

    screen_size / minimap_size: feature layer sides in pixels (fullyconv needs them equal).
    step_mul: game steps per agent step (SC2LE: 8, about 180 actions per minute).
    bot: `race:difficulty` (e.g. `terran:easy`) of the built-in bot on a melee map, instead of a
      second agent; empty = every player is an agent (self-play, league).
    replay_dir: save a pysc2 replay of every episode into this folder (for evaluation games).
    mock: pysc2's mock env (constant observations, no game needed; for tests).
    """

    screen_size: int = 32
    minimap_size: int = 32
    step_mul: int = 8
    bot: str = ""
    replay_dir: str = ""
    mock: bool = False

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any] | None) -> "SC2Settings":
        """Build and check settings. Raises ValueError naming the bad key or value and the fix."""
        fields = {f.name: f.type for f in dataclasses.fields(cls)}
        for key, value in (kwargs or {}).items():
            if key not in fields:
                close = difflib.get_close_matches(key, fields, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                raise ValueError(f"StarCraft II env.kwargs has no '{key}'{hint}; valid: {', '.join(fields)}")
            want = {"int": int, "str": str, "bool": bool}[fields[key]]
            if type(value) is not want:
                raise ValueError(f"env.kwargs.{key} must be {fields[key]}, got {value!r}")
        settings = cls(**(kwargs or {}))
        for key in ("screen_size", "minimap_size"):
            if not 8 <= getattr(settings, key) <= 256:
                raise ValueError(f"env.kwargs.{key} must be in [8, 256]")
        if settings.step_mul < 1:
            raise ValueError("env.kwargs.step_mul must be >= 1")
        parse_bot(settings.bot)
        return settings


@dataclass(frozen=True)
class SC2Game:
    """One `sc2:<map>` env under its settings.

    map_name: pysc2's map name; agents: agent names in player order (`player_0`, `player_1`); bot:
    (race, difficulty) of a built-in opponent, or None; obs: observation sizes; codec: action heads.
    """

    map_name: str
    settings: SC2Settings
    agents: tuple[str, ...]
    bot: tuple[str, str] | None
    obs: SC2ObservationSpec
    codec: FunctionCallCodec


def map_players(map_name: str) -> int:
    """Players on pysc2 map `map_name` (1 for minigames, 2 for melee maps). Raises ValueError if unknown."""
    try:
        return int(maps.get(map_name).players)
    except maps.lib.NoMapError:
        close = difflib.get_close_matches(map_name, sorted(maps.get_maps()), n=1)
        hint = f"; did you mean '{PREFIX}{close[0]}'?" if close else ""
        raise ValueError(f"pysc2 has no map '{map_name}'{hint}") from None


def parse_bot(text: str) -> tuple[str, str] | None:
    """`race:difficulty` (e.g. `terran:easy`) -> (race, difficulty); '' -> None. Raises ValueError."""
    if not text:
        return None
    race, _, difficulty = text.partition(":")
    if race not in RACES or difficulty not in DIFFICULTIES:
        raise ValueError(f"env.kwargs.bot '{text}' must be race:difficulty with race in {', '.join(RACES)} and "
                         f"difficulty in {', '.join(DIFFICULTIES)}")
    return race, difficulty


def sc2_game(name: str, kwargs: Mapping[str, Any] | None = None) -> SC2Game:
    """The SC2Game of env `name` (`sc2:<map>`) with `kwargs`. Raises ValueError for a bad map or setting."""
    map_name = name[len(PREFIX):]
    players = map_players(map_name)
    settings = SC2Settings.from_kwargs(kwargs)
    bot = parse_bot(settings.bot)
    if players == 1 and bot is not None:
        raise ValueError(f"{map_name} is a one-player map; leave env.kwargs.bot empty")
    agents = tuple(f"player_{i}" for i in range(1 if bot else players))
    return SC2Game(map_name, settings, agents, bot, SC2ObservationSpec(settings.screen_size, settings.minimap_size),
                   FunctionCallCodec(settings.screen_size, settings.minimap_size))


def sc2_spec(name: str, kwargs: Mapping[str, Any] | None = None) -> EnvSpec:
    """The EnvSpec of `sc2:<map>`: one seat per agent, observation arrays screen / minimap / player,
    action mask = available_actions over the 573 function ids, and the FunctionCall heads."""
    game = sc2_game(name, kwargs)
    arrays = tuple((k, shape, dtype) for k, (shape, dtype) in game.obs.arrays().items() if k != AVAILABLE_ACTIONS)
    return EnvSpec(name, (), np.dtype(np.uint16), NUM_FUNCTIONS, game.agents, version="pysc2-4.0.0",
                   agents=game.agents, agent_seats=tuple(range(len(game.agents))), kind="sc2",
                   obs_arrays=arrays, action_heads=tuple(h.size for h in game.codec.heads))


def check_game_installed(name: str, kwargs: Mapping[str, Any] | None = None) -> None:
    """Before any actor starts: the game must be installed unless the mock is asked for.

    Raises SC2NotInstalledError saying where it looked and how to fix it.
    """
    if name.startswith(PREFIX) and not (kwargs or {}).get("mock", False):
        try:
            require_game()
        except SC2NotInstalledError as e:
            raise SC2NotInstalledError(f"{name}: {e} (or set env.kwargs.mock=true to run pysc2's mock env)") from None


class SC2Adapter:
    """One pysc2 game, all agents acting at once, episodes concatenated (see envs/base.py).

    Observations are the dicts of `encode_observation` without `available_actions`, which is the
    action mask; actions are encoded FunctionCalls (int64 [num_heads], envs/sc2_wrappers/actions.py).

    Args:
      game: the SC2Game (`sc2_game(name, kwargs)`).
      seed: the game's random seed (pysc2 `random_seed`).

    Raises pysc2's SC2LaunchError if the game fails to start.
    """

    def __init__(self, game: SC2Game, seed: int):
        self.game = game
        players = [sc2_env.Agent(sc2_env.Race[AGENT_RACE], name) for name in game.agents]
        if game.bot:
            players.append(sc2_env.Bot(sc2_env.Race[game.bot[0]], sc2_env.Difficulty[game.bot[1]]))
        s = game.settings
        interface = sc2_env.AgentInterfaceFormat(
            feature_dimensions=sc2_env.Dimensions(screen=s.screen_size, minimap=s.minimap_size))
        kwargs: dict[str, Any] = dict(map_name=game.map_name, players=players, agent_interface_format=interface,
                                      step_mul=s.step_mul, random_seed=seed)
        if s.replay_dir:
            os.makedirs(s.replay_dir, exist_ok=True)
            kwargs.update(save_replay_episodes=1, replay_dir=os.path.abspath(s.replay_dir))
        self.env = (mock_sc2_env.SC2TestEnv if s.mock else sc2_env.SC2Env)(**kwargs)
        self._pending: list[Settlement] = []
        self._episodes: list[EpisodeResult] = []
        self._start(self.env.reset())

    def _start(self, timesteps) -> None:
        self._timesteps = timesteps
        self._returns = [0.0] * len(self.game.agents)
        self._length = 0

    def advance(self) -> Step:
        """Every agent acts; with what was settled since the last call."""
        encoded = [encode_observation(ts.observation, self.game.obs) for ts in self._timesteps]
        masks = [e.pop(AVAILABLE_ACTIONS) for e in encoded]
        for agent, mask in zip(self.game.agents, masks):
            check_mask(mask, f"sc2:{self.game.map_name}", agent, self._length)
        step = Step(list(range(len(self.game.agents))), encoded, masks, self._pending, self._episodes)
        self._pending, self._episodes = [], []
        return step

    def act(self, actions: Sequence[np.ndarray]) -> None:
        """Step the game with one encoded action per agent of the last `advance`, in its order."""
        timesteps = self.env.step([self.game.codec.to_function_call(a) for a in actions])
        self._length += 1
        done = timesteps[0].last()
        for i, ts in enumerate(timesteps):
            self._returns[i] += float(ts.reward)
            if done and ts.discount > 0:  # pysc2's step limit, not the game's end
                final = encode_observation(ts.observation, self.game.obs)
                final.pop(AVAILABLE_ACTIONS)
                self._pending.append(Settlement(i, float(ts.reward), True, truncated=True, final_observation=final))
            else:
                self._pending.append(Settlement(i, float(ts.reward), done))
        if done:
            self._episodes.append(EpisodeResult(tuple(self._returns), self._length, leader(self._returns)))
            self._start(self.env.reset())
        else:
            self._timesteps = timesteps

    def close(self) -> None:
        self.env.close()
