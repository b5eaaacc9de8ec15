"""StarCraft II games as `sc2:<map>` envs: minigames (one agent) and melee maps (two agents, or one
agent against the game's built-in bot).

Every agent acts at every step (a simultaneous game). Which reward belongs where:
* *Minigames* (MoveToBeacon, CollectMineralShards, ...): the map's score change since the last step
  (pysc2's reward), for the one agent.
* *Melee maps* (Simple64, ...): pysc2's outcome reward, +1 / -1 / 0 on the last step for each agent
  (a draw or a time-out gives 0 to both).
* *Episode end*: pysc2 marks every agent's last timestep at once; each agent's stream ends with done
  on its last action. The env is then reset and play goes on (episodes concatenated, as the actor
  expects).
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass

import numpy as np
from pysc2 import maps
from pysc2.env import mock_sc2_env, sc2_env

from config import ConfigError, EnvConfig
from envs.sc2_wrappers.actions import FunctionCallCodec
from envs.sc2_wrappers.compat import SC2NotInstalledError, require_game
from envs.sc2_wrappers.observation import SC2ObservationSpec, encode_observation

PREFIX = "sc2:"
RACES = tuple(sc2_env.Race.__members__)
DIFFICULTIES = tuple(sc2_env.Difficulty.__members__)
AGENT_RACE = "random"  # learners play a random race, so one policy covers all three


@dataclass(frozen=True)
class SC2Game:
    """What the rest of the project needs to know about one `sc2:<map>` env under a config.

    map_name: pysc2's map name; agents: agent names in player order (`player_0`, `player_1`);
    bot: (race, difficulty) of a built-in opponent, or None; obs: observation arrays; codec: action heads.
    """

    map_name: str
    agents: tuple[str, ...]
    bot: tuple[str, str] | None
    obs: SC2ObservationSpec
    codec: FunctionCallCodec


def map_players(map_name: str) -> int:
    """Players on pysc2 map `map_name` (1 for minigames, 2 for melee maps). Raises ValueError if unknown."""
    try:
        return int(maps.get(map_name).players)
    except maps.lib.NoMapError:
        names = sorted(maps.get_maps())
        close = difflib.get_close_matches(map_name, names, n=1)
        hint = f"; did you mean '{PREFIX}{close[0]}'?" if close else ""
        raise ValueError(f"pysc2 has no map '{map_name}'{hint}") from None


def parse_bot(text: str) -> tuple[str, str] | None:
    """`race:difficulty` (e.g. `terran:easy`) -> (race, difficulty); '' -> None. Raises ValueError."""
    if not text:
        return None
    race, _, difficulty = text.partition(":")
    if race not in RACES or difficulty not in DIFFICULTIES:
        raise ValueError(f"env.bot '{text}' must be race:difficulty with race in {', '.join(RACES)} and "
                         f"difficulty in {', '.join(DIFFICULTIES)}")
    return race, difficulty


def sc2_game(env_cfg: EnvConfig) -> SC2Game:
    """The SC2Game of `env_cfg` (env.name = `sc2:<map>`). Raises ConfigError for a bad map, sizes or bot."""
    map_name = env_cfg.name[len(PREFIX):]
    try:
        players = map_players(map_name)
        bot = parse_bot(env_cfg.bot)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if players == 1 and bot is not None:
        raise ConfigError(f"env.bot: {map_name} is a one-player map; leave env.bot empty")
    for key in ("screen_size", "minimap_size"):
        if not 8 <= getattr(env_cfg, key) <= 256:
            raise ConfigError(f"env.{key} must be in [8, 256]")
    if env_cfg.step_mul < 1:
        raise ConfigError("env.step_mul must be >= 1")
    agents = tuple(f"player_{i}" for i in range(1 if bot else players))
    return SC2Game(map_name, agents, bot, SC2ObservationSpec(env_cfg.screen_size, env_cfg.minimap_size),
                   FunctionCallCodec(env_cfg.screen_size, env_cfg.minimap_size))


def check_game_installed(env_cfg: EnvConfig) -> None:
    """Before any actor starts: the game must be installed unless env.mock. Raises ConfigError saying how."""
    if env_cfg.name.startswith(PREFIX) and not env_cfg.mock:
        try:
            require_game()
        except SC2NotInstalledError as e:
            raise ConfigError(f"{env_cfg.name}: {e} (or set env.mock=true to run pysc2's mock env)") from None


class SC2Adapter:
    """One pysc2 game stepped by all its agents at once; episodes are concatenated.

    Args:
      env_cfg: env.* of the config (map, sizes, step_mul, bot, mock).
      seed: the game's random seed (pysc2 `random_seed`); episodes of one game follow from it.
      replay_dir: save a replay of every episode here (evaluation games), or None.

    Raises ConfigError (via `sc2_game`) for a bad env config; pysc2's SC2LaunchError if the game fails
    to start.
    """

    def __init__(self, env_cfg: EnvConfig, seed: int, replay_dir: str | None = None):
        self.game = sc2_game(env_cfg)
        players = [sc2_env.Agent(sc2_env.Race[AGENT_RACE], name) for name in self.game.agents]
        if self.game.bot:
            race, difficulty = self.game.bot
            players.append(sc2_env.Bot(sc2_env.Race[race], sc2_env.Difficulty[difficulty]))
        interface = sc2_env.AgentInterfaceFormat(
            feature_dimensions=sc2_env.Dimensions(screen=env_cfg.screen_size, minimap=env_cfg.minimap_size))
        kwargs = dict(map_name=self.game.map_name, players=players, agent_interface_format=interface,
                      step_mul=env_cfg.step_mul, random_seed=seed)
        if replay_dir:
            os.makedirs(replay_dir, exist_ok=True)
            kwargs.update(save_replay_episodes=1, replay_dir=os.path.abspath(replay_dir))
        self.env = (mock_sc2_env.SC2TestEnv if env_cfg.mock else sc2_env.SC2Env)(**kwargs)
        self.observations: list[dict[str, np.ndarray]] = self._encode(self.env.reset())

    def _encode(self, timesteps) -> list[dict[str, np.ndarray]]:
        return [encode_observation(ts.observation, self.game.obs) for ts in timesteps]

    def step(self, actions: list[np.ndarray]) -> tuple[list[float], bool]:
        """Apply one encoded action (int64 [num_heads]) per agent; returns (rewards per agent, done).

        After a done step the env has been reset: `observations` is the new episode's first.
        """
        timesteps = self.env.step([self.game.codec.to_function_call(a) for a in actions])
        rewards = [float(ts.reward) for ts in timesteps]
        done = timesteps[0].last()
        self.observations = self._encode(self.env.reset() if done else timesteps)
        return rewards, done

    def close(self) -> None:
        self.env.close()
