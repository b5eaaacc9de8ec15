"""Built-in memory tasks: one-agent gymnasium envs that a memoryless policy cannot solve.

`CueRecall` (registry name `cue_recall`) is the smallest test of a recurrent core: remember one
symbol across a delay of blank steps, then name it.
"""

from __future__ import annotations

from typing import Any, Optional

import gymnasium
import numpy as np
from gymnasium import spaces

CUE_RECALL_VERSION = "cue_recall_v0"  # replays record it (EnvSpec.version); bump it when episodes change


class CueRecall(gymnasium.Env):
    """Show a cue, wait `delay` blank steps, then ask which cue it was.

    An episode, with C = `num_cues` and observations float32 `[C + 1]`:

    ========  =====================================  ==========================================
    step t    observation                            the action taken at t
    ========  =====================================  ==========================================
    0         one-hot of the cue in slots 0..C-1,    ignored, reward 0
              slot C = 0
    1..delay  all zeros (blank)                      ignored, reward 0
    delay+1   slot C = 1 (the query), cue slots 0    the answer: reward 1.0 if it equals the
                                                     cue, else 0.0; the episode terminates
    ========  =====================================  ==========================================

    The cue is uniform over 0..C-1 and `delay` uniform over `delay_min..delay_max` (both ends
    included), both drawn at `reset` from the env's `np_random`, so `reset(seed=s)` fixes the episode
    (the project's `EpisodeSeeds` reseeds every episode). An episode is `delay + 2` steps long, always
    ends terminated (never truncated), and its return is 1 when the answer is right, else 0: the mean
    return is the fraction of queries answered right. A memoryless policy, which sees the same
    observation at every query, scores 1 / C; a policy that carries the cue in its state scores 1.
    The answering step's `info` holds `cue` (for inspection; the policy never sees it).

    Args:
      num_cues: C >= 2, the number of cues and of actions (Discrete(C)).
      delay_min, delay_max: bounds of the blank steps between cue and query, 0 <= min <= max.
      render_mode: only None (nothing to draw).
    """

    metadata = {"render_modes": []}

    def __init__(self, num_cues: int = 2, delay_min: int = 8, delay_max: int = 24, render_mode: Optional[str] = None):
        if int(num_cues) < 2:
            raise ValueError(f"cue_recall: num_cues must be at least 2, got {num_cues}")
        if not 0 <= int(delay_min) <= int(delay_max):
            raise ValueError(f"cue_recall: need 0 <= delay_min <= delay_max, got delay_min={delay_min}, "
                             f"delay_max={delay_max}")
        if render_mode is not None:
            raise ValueError(f"cue_recall: render_mode {render_mode!r} is not supported (it draws nothing)")
        self.num_cues, self.delay_min, self.delay_max = int(num_cues), int(delay_min), int(delay_max)
        self.render_mode = None
        self.observation_space = spaces.Box(0.0, 1.0, (self.num_cues + 1,), np.float32)
        self.action_space = spaces.Discrete(self.num_cues)
        self.cue = -1  # this episode's cue and delay, set by reset
        self.delay = 0
        self._t = -1  # steps taken in this episode; -1 = no episode running (call reset)

    def _observation(self) -> np.ndarray:
        obs = np.zeros(self.num_cues + 1, np.float32)
        if self._t == 0:
            obs[self.cue] = 1.0
        elif self._t == self.delay + 1:
            obs[self.num_cues] = 1.0
        return obs

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.cue = int(self.np_random.integers(self.num_cues))
        self.delay = int(self.np_random.integers(self.delay_min, self.delay_max + 1))
        self._t = 0
        return self._observation(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self._t < 0:
            raise RuntimeError("cue_recall: step() before reset() or after the episode ended")
        if self._t == self.delay + 1:  # the query: the action is the answer
            reward = 1.0 if int(action) == self.cue else 0.0
            self._t = -1
            return np.zeros(self.num_cues + 1, np.float32), reward, True, False, {"cue": self.cue}
        self._t += 1
        return self._observation(), 0.0, False, False, {}
