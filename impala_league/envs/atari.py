"""Atari 2600 games through the Arcade Learning Environment (`ale-py`, whose wheel carries the ROMs).

`atari:<Game>` (e.g. `atari:Pong`, `atari:Breakout`) is gymnasium's `ALE/<Game>-v5` under gymnasium's
own `AtariPreprocessing` and `FrameStackObservation`: a policy trained here sees exactly what an
evaluator built from those wrappers shows it. The protocol is the one of the published IMPALA, A3C and
DQN curves (Mnih et al. 2015; Espeholt et al. 2018; Machado et al. 2018 discuss each choice), with
Machado et al.'s sticky actions:

* sticky actions (`sticky_actions`, a probability in [0, 1)): at every emulator frame the ALE repeats
  the previous action with probability 0.25, Machado et al.'s protocol and ALE v5's own default, so a
  policy cannot win by replaying a memorised sequence in a deterministic game; 0 turns them off (the
  protocol of the published IMPALA, A3C and DQN curves);
* the minimal action set of the game;
* a frame skip of 4: the action is repeated 4 times, the observation is the max over the last two
  frames (Atari sprites flicker), rewards are summed;
* 84 x 84 grayscale, resized with OpenCV's area interpolation, uint8;
* a stack of the last 4 frames, channels first: [4, 84, 84] (1 with a recurrent core, if you like);
* up to 30 no-op actions at the start of each episode (a random number, from the episode's seed);
* episodes cut at 108,000 emulator frames (30 minutes of play): a time limit, settled as truncated
  (the learner bootstraps from the final observation), not as the game's end; a cut inside the frame
  skip ends on the screen after its last played frame (`AtariPreprocessingAtEnds`);
* `end_on_life_loss`: IMPALA's and DQN's training episodes ended at a lost life (discount 0, the
  core reset) while the game went on; off by default, as Machado et al. advise. Scores are always
  those of full games.

Rewards are the game's score changes, unclipped; `learner.reward_clipping` clips them for the loss
only, so every episode statistic is the game's own score.

`emulator` picks what steps an actor's games, with the preprocessing above either way:

* `gymnasium` (the default, the reference): one gymnasium env per env slot of the actor, built by
  `make_atari`.
* `ale_vector`: ale-py's C++ `AtariVectorEnv` runs all `actor.num_envs` games of an actor in one object
  (envs/atari_vector.py), on `emulator_threads` threads (1: an actor is one process per core). It
  preprocesses in C++ as gymnasium's wrappers do in Python; its frames are the same except the first
  ones of an episode, whose stack it pads with zeros where `FrameStackObservation` repeats the reset
  frame, and its no-op starts are drawn from its own random numbers (an episode can start with no
  no-op, where `AtariPreprocessing` plays 1 to `noop_max`), and it cuts a game at the end of the step
  that reaches the time limit (frames counted after the no-op start), never inside the skip.
  Evaluation and replays, one game at a time, always play the gymnasium path
  (`envs.registry.make_env`); only the actor's `make_envs` reads this setting.
"""

from __future__ import annotations

import difflib
from typing import Any, Optional

import gymnasium
from gymnasium.wrappers import AtariPreprocessing as AtariPreprocessingBase

ALE_PACKAGES = "ale-py and opencv-python-headless (in requirements.txt: bash scripts/bootstrap.sh installs them)"
LIFE_LOST = "life_lost"  # info key: the step lost a life (envs.parallel settles it as done when asked to)
EMULATORS = ("gymnasium", "ale_vector")  # env.kwargs.emulator: see the module doc
DEFAULTS = dict(frame_stack=4, frame_skip=4, noop_max=30, screen_size=84, sticky_actions=0.25,
                max_episode_frames=108_000, end_on_life_loss=False, full_action_space=False,
                emulator="gymnasium", emulator_threads=1)


def _ale():
    """Registers the ALE/* ids with gymnasium, or raises a ValueError naming the packages to install."""
    try:
        import ale_py
        import cv2  # noqa: F401  (AtariPreprocessing resizes with it)
    except ImportError as e:
        raise ValueError(f"atari:<Game> needs {ALE_PACKAGES}: {e}") from None
    # Warnings and errors only: not the ALE's two-line banner on stderr, above every one-line error of run.py.
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Warning)
    gymnasium.register_envs(ale_py)


def games() -> list[str]:
    """Every game name `atari:<Game>` takes, e.g. `Pong`, `Breakout`, `MontezumaRevenge`."""
    _ale()
    return sorted(i[len("ALE/"):-len("-v5")] for i in gymnasium.registry if i.startswith("ALE/") and i.endswith("-v5"))


def env_id(game: str) -> str:
    """`ALE/<game>-v5`, or a ValueError naming the closest games."""
    _ale()
    full = f"ALE/{game}-v5"
    if full in gymnasium.registry:
        return full
    names = games()
    lowered = {n.lower(): n for n in names}
    close = [lowered[c] for c in difflib.get_close_matches(game.lower(), list(lowered), n=3, cutoff=0.5)]
    hint = f"did you mean {', '.join(f'atari:{c}' for c in close)}?" if close else f"{len(names)} games, e.g. atari:Pong"
    raise ValueError(f"unknown Atari game '{game}'; {hint}")


def settings(kwargs: dict[str, Any]) -> dict[str, Any]:
    """DEFAULTS updated with the config's env.kwargs; a ValueError names an unknown key or a bad value."""
    unknown = sorted(set(kwargs) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"atari:<Game> does not take env.kwargs {unknown}; it takes {', '.join(DEFAULTS)}")
    out = {**DEFAULTS, **kwargs}
    for key in ("frame_stack", "frame_skip", "screen_size", "max_episode_frames"):
        if not isinstance(out[key], int) or out[key] < 1:
            raise ValueError(f"env.kwargs.{key} must be an integer >= 1, got {out[key]!r}")
    if not isinstance(out["noop_max"], int) or out["noop_max"] < 0:
        raise ValueError(f"env.kwargs.noop_max must be an integer >= 0, got {out['noop_max']!r}")
    check_sticky_actions(out["sticky_actions"])
    if out["emulator"] not in EMULATORS:
        raise ValueError(f"env.kwargs.emulator must be one of {', '.join(EMULATORS)}, got {out['emulator']!r}")
    if not isinstance(out["emulator_threads"], int) or isinstance(out["emulator_threads"], bool) \
            or out["emulator_threads"] < 1:
        raise ValueError(f"env.kwargs.emulator_threads must be an integer >= 1, got {out['emulator_threads']!r}")
    if out["emulator_threads"] != 1 and out["emulator"] != "ale_vector":
        raise ValueError(f"env.kwargs.emulator_threads={out['emulator_threads']} is for emulator=ale_vector "
                         f"(the gymnasium path steps each game in the actor's own thread)")
    return out


def check_sticky_actions(value: Any) -> None:
    """Raise a ValueError unless `value` is a probability in [0, 1) (1 would repeat the first action forever)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) < 1.0:
        raise ValueError(f"env.kwargs.sticky_actions must be a probability in [0, 1) (0.25 is Machado et al.'s "
                         f"and ALE v5's; 0 turns them off), got {value!r}")


def make_atari(game: str, kwargs: dict[str, Any], render_mode: Optional[str] = None):
    """The gymnasium env of `atari:<game>` with `settings(kwargs)`: observations uint8
    [frame_stack, screen_size, screen_size], Discrete(minimal action set), rewards unclipped.

    Raises ValueError for an unknown game (naming the closest), bad kwargs, or a missing package."""
    s = settings(kwargs)
    _ale()
    from gymnasium.wrappers import FrameStackObservation

    extra = {} if render_mode is None else {"render_mode": render_mode}
    # obs_type grayscale: AtariPreprocessing reads the screens from the emulator itself, so the base env's
    # own observation per emulator frame is thrown away; gray is a third of RGB's copy (the frames agree).
    env = gymnasium.make(env_id(game), frameskip=1, obs_type="grayscale",
                         repeat_action_probability=float(s["sticky_actions"]),
                         full_action_space=bool(s["full_action_space"]),
                         max_num_frames_per_episode=s["max_episode_frames"], **extra)
    env = AtariPreprocessingAtEnds(env, noop_max=s["noop_max"], frame_skip=s["frame_skip"],
                                   screen_size=s["screen_size"], terminal_on_life_loss=False, grayscale_obs=True,
                                   scale_obs=False)
    if s["end_on_life_loss"]:
        env = LifeLossInfo(env)
    return FrameStackObservation(env, s["frame_stack"])


def read_end_screens(ale: Any, buffers: list, played: int, frame_skip: int) -> None:
    """Refill the two max-pooled screens (`buffers`, uint8 [210, 160] each) after a step whose frame skip
    ended the episode at its `played`-th frame (1..frame_skip): the time limit or the game's end.

    gymnasium's `AtariPreprocessing` (and `envs.atari2p.Preprocessed`, which does what it does) leaves
    the skip at such a frame before it reads the screen, so its buffers still hold the previous step's
    frames, and a truncated step's final observation, the one its value is bootstrapped from, would
    show a stale screen. buffers[0] gets the screen now; buffers[1] keeps the skip's next-to-last frame
    when the skip played all its frames (pooled as every step is), else it gets the same screen: the
    skip never reached the pair it pools, and the newest frame is the screen after the last one played.
    """
    ale.getScreenGrayscale(buffers[0])
    if played < frame_skip:
        buffers[1][...] = buffers[0]


class AtariPreprocessingAtEnds(AtariPreprocessingBase):
    """gymnasium's `AtariPreprocessing` (grayscale), whose observation at an episode's end is the screen
    after the step's last played frame (`read_end_screens`); every other step is gymnasium's own."""

    def step(self, action):
        start = self.ale.getEpisodeFrameNumber()
        obs, reward, terminated, truncated, info = super().step(action)
        if terminated or truncated:
            read_end_screens(self.ale, self.obs_buffer, self.ale.getEpisodeFrameNumber() - start, self.frame_skip)
            obs = self._get_obs()
        return obs, reward, terminated, truncated, info


class LifeLossInfo(gymnasium.Wrapper):
    """Marks `info[LIFE_LOST]` on a step that lost a life without ending the game."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.lives = info.get("lives", 0)
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = info.get("lives", 0)
        if lives < self.lives and not (terminated or truncated):
            info = {**info, LIFE_LOST: True}
        self.lives = lives
        return obs, reward, terminated, truncated, info
