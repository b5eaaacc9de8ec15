"""`atari:<Game>` with `env.kwargs.emulator=ale_vector`: all of an actor's games in one ale-py `AtariVectorEnv`.

The actor sees the same per-slot interface as with one gymnasium env per slot (`advance() -> Step`,
`act(actions)`), with the semantics of `envs.parallel.single_agent_adapter` on `envs.atari.make_atari`:

* each action of a slot gives exactly one settlement of that slot, reward unclipped;
* the game's end settles with `done=True`; the `max_episode_frames` time limit with `done=True,
  truncated=True` and the frame stack of the state the episode was cut in (`final_observation`);
  see "Time limits" below;
* with `end_on_life_loss`, a step that loses a life without ending the game settles with `done=True`
  while the game goes on (as `envs.atari.LifeLossInfo` marks `LIFE_LOST`);
* every finished game gives an `EpisodeResult((score,), env steps, leader((score,)))`, the game's own
  score, and the slot plays on in a new game without a gap.

The vector env resets a finished game within the step that ended it (ale-py's same-step autoreset):
the step's observation is the new game's first, the cut game's last one comes in `info["final_obs"]`,
and no action is spent on a reset.

Stepping: `AtariVectorGroup` owns the vector env and its N slots (`group.slots`). A slot's `act` only
records its action; once every slot has acted the group steps all games at once, and each slot's
next `advance` returns its part. So a caller acts on every slot first and then advances every slot
(what distributed/actor.py's loop does); advancing a slot that has acted before the others have
raises a RuntimeError instead of returning a stale step.

Time limits: ale-py's vector env (0.12.0 and 0.12.1 alike) leaves its frame skip at the limit's frame
before it reads the screen, so the final observation it gives a cut game holds the previous step's
frames, and nothing outside it can read the emulator's screen. So the group cuts games itself, at a
step's end: a game is cut after ceil(max_episode_frames / frame_skip) steps (frames counted from the
end of its no-op start, as the vector env counts them), with that step's own observation, fully
played and pooled, as the final observation. The vector env's own limit is set one frame later, so
the slot's next vector step is the cut game's reset: that step plays one NOOP frame of the old game,
which the vector env ends and resets within the step, and its outcome belongs to no episode. The slot
sits that step out: its `advance` after the cut has no acting agent (`Step.agents` empty; `act([])`).
The gymnasium path cuts at the limit's frame itself, no-op frames included, inside the skip when the
limit falls there (`envs.atari.read_end_screens`).

Seeds: the vector env is seeded once, at construction: game i with the low 31 bits of slot i's
episode-0 seed (`envs.base.EpisodeSeeds(seed_i)(0)`; ale-py takes a C int). Later episodes of game i
follow from the emulator's own random state (its no-op starts, sticky actions), not from the episode
seeds k >= 1 that one gymnasium env per slot would be reset with. The same seeds and actions give the
same games (one thread or several: each game keeps its own state).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from impala_league.envs import atari
from impala_league.envs.base import EpisodeResult, EpisodeSeeds, GroupSlot, Settlement, Step, leader


def ale_game(game: str) -> str:
    """ale-py's ROM id of `atari:<game>` (`Pong` -> `pong`, `MsPacman` -> `ms_pacman`), or a ValueError
    naming the closest games."""
    atari.env_id(game)  # unknown games are refused here, with the closest names
    from ale_py import roms
    from ale_py.registration import rom_id_to_name

    ids = {rom_id_to_name(rom): rom for rom in roms.get_all_rom_ids()}
    if game not in ids:
        raise ValueError(f"atari:{game} has no ROM id in ale-py's vector env")
    return ids[game]


def vector_seed(seed: int | np.random.SeedSequence) -> int:
    """The seed a slot gives its game in the vector env: the low 31 bits of its episode-0 seed."""
    return EpisodeSeeds(seed)(0) % (1 << 31)


class AtariVectorGroup:
    """One `AtariVectorEnv` holding N games of `atari:<game>`, seen as N slots (`self.slots`).

    Args:
      game: the game's name as in `atari:<game>` (`Pong`).
      seeds: one per slot, an int or a numpy SeedSequence (see the module doc: used once).
      kwargs: the config's env.kwargs (`envs.atari.settings`); `emulator_threads` threads step the games.
      name: the env's registry name, for error messages.
    """

    def __init__(self, game: str, seeds: Sequence[int | np.random.SeedSequence],
                 kwargs: Mapping[str, Any] | None = None, name: str | None = None):
        s = atari.settings(dict(kwargs or {}))
        self.name = name or f"atari:{game}"
        if not seeds:
            raise ValueError(f"env '{self.name}': a vector env needs at least one slot (one seed per slot)")
        rom = ale_game(game)
        from ale_py.vector_env import AtariVectorEnv
        from gymnasium.vector import AutoresetMode

        if not hasattr(AutoresetMode, "SAME_STEP"):
            raise ValueError(f"env '{self.name}': emulator=ale_vector needs gymnasium's same-step autoreset "
                             f"(gymnasium >= 1.1 and ale-py >= 0.11, as in requirements.txt)")
        n = len(seeds)
        self.end_on_life_loss = bool(s["end_on_life_loss"])
        self.max_steps = -(-s["max_episode_frames"] // s["frame_skip"])  # steps of a game before its cut
        self.env = AtariVectorEnv(
            rom, n, num_threads=s["emulator_threads"], noop_max=s["noop_max"], reward_clipping=False,
            use_fire_reset=False, episodic_life=False, life_loss_info=False,
            repeat_action_probability=float(s["sticky_actions"]), full_action_space=bool(s["full_action_space"]),
            stack_num=s["frame_stack"], frameskip=s["frame_skip"], maxpool=s["frame_skip"] > 1,
            img_height=s["screen_size"], img_width=s["screen_size"], grayscale=True,
            # one frame past the group's own cut: the vector env ends a cut game in the step after it
            max_num_frames_per_episode=self.max_steps * s["frame_skip"] + 1, autoreset_mode=AutoresetMode.SAME_STEP)
        self.num_envs = n
        self.num_actions = int(self.env.single_action_space.n)
        self.obs_shape = tuple(self.env.single_observation_space.shape)
        self.seeds = [vector_seed(seed) for seed in seeds]
        obs, info = self.env.reset(seed=np.array(self.seeds, np.int64))
        self._obs = obs  # [N, stack, H, W] uint8, a fresh array from every step: slots hand out views of it
        self._lives = np.array(info["lives"])
        self._all_legal = np.ones(self.num_actions, np.uint8)
        self._actions = np.zeros(n, np.int64)
        self._acted = np.zeros(n, bool)  # which slots have acted since the last step
        self._resetting = np.zeros(n, bool)  # slots cut at the last step: the next step resets their game
        self._returns = np.zeros(n, np.float64)
        self._lengths = np.zeros(n, np.int64)
        self._pending: list[list[Settlement]] = [[] for _ in range(n)]
        self._episodes: list[list[EpisodeResult]] = [[] for _ in range(n)]
        self.steps = 0  # vector steps taken (each steps every game once)
        self.slots = [GroupSlot(self, i) for i in range(n)]

    def advance(self, i: int) -> Step:
        """Slot i's step: its one agent, its observation (a view of this step's frames), the settlements
        and finished games since its last `advance`."""
        if self._acted[i]:
            raise RuntimeError(f"env '{self.name}': slot {i} was advanced after acting but before the other "
                               f"{self.num_envs - int(self._acted.sum())} slot(s) of its vector env acted; act on "
                               f"every slot of the group first, then advance them")
        if self._resetting[i]:
            step = Step([], [], [], self._pending[i], self._episodes[i])
        else:
            step = Step([0], [self._obs[i]], [self._all_legal], self._pending[i], self._episodes[i])
        self._pending[i], self._episodes[i] = [], []
        return step

    def act(self, i: int, actions: Sequence[int]) -> None:
        """Record slot i's action (none in the step after its game's cut); the last slot to act steps
        every game."""
        if len(actions) != 1 - self._resetting[i]:
            raise ValueError(f"env '{self.name}': slot {i} takes {1 - self._resetting[i]} action(s) now, "
                             f"got {len(actions)}")
        if self._acted[i]:
            raise RuntimeError(f"env '{self.name}': slot {i} acted twice before the other slots of its vector env "
                               f"acted")
        action = int(actions[0]) if len(actions) else 0  # NOOP for a cut game's last frame
        if not 0 <= action < self.num_actions:
            raise ValueError(f"env '{self.name}': action {action} is outside 0..{self.num_actions - 1}")
        self._actions[i] = action
        self._acted[i] = True
        if self._acted.all():
            self._step()

    def _step(self) -> None:
        obs, rewards, terminated, truncated, info = self.env.step(self._actions)
        self._acted[:] = False
        self.steps += 1
        lives = np.array(info["lives"])
        resetting, self._resetting = self._resetting, np.zeros(self.num_envs, bool)
        self._returns += rewards
        self._lengths += 1
        lost = (lives < self._lives) if self.end_on_life_loss else np.zeros(self.num_envs, bool)
        for i in range(self.num_envs):
            if resetting[i]:  # the cut game's one NOOP frame, then its reset: no episode's step
                if not (terminated[i] or truncated[i]):
                    raise RuntimeError(f"env '{self.name}': game {i} was not reset in the step after its cut")
                self._returns[i], self._lengths[i] = 0.0, 0
                continue
            if truncated[i]:  # the group cuts every game first (see the module doc)
                raise RuntimeError(f"env '{self.name}': the vector env cut game {i} before the group did")
            reward = float(rewards[i])
            cut = not terminated[i] and self._lengths[i] >= self.max_steps
            if terminated[i]:
                settlement = Settlement(0, reward, True)
            elif cut:
                settlement = Settlement(0, reward, True, truncated=True, final_observation=obs[i].copy())
                self._resetting[i] = True
            else:
                settlement = Settlement(0, reward, bool(lost[i]))
            self._pending[i].append(settlement)
            if terminated[i] or cut:
                score = float(self._returns[i])
                self._episodes[i].append(EpisodeResult((score,), int(self._lengths[i]), leader((score,))))
                self._returns[i], self._lengths[i] = 0.0, 0
        self._obs, self._lives = obs, lives

    def close(self) -> None:
        self.env.close()
