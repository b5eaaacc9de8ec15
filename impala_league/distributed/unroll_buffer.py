"""One learning stream's unrolls as an actor builds them (`UnrollBuffer`): steps observed, acted and
settled, cut every T steps into the arrays of `codec.UnrollSpec`, the bootstrap step carried over.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from impala_league.distributed.wire.codec import UnrollSpec


class UnrollBuffer:
    """Builds the unrolls of one learning stream (one seat of one env), episodes concatenated.

    A step is opened by `observe` (the seat must act), gets its action from `record_action`, and is
    closed by `settle` (its reward and done flag, known once the seat observes again or the game ends).
    When step T is observed, steps 0..T-1 are complete and step T's observation is the bootstrap
    observation: `observe` returns the finished unroll and step T becomes step 0 of the next one.
    A step settled as truncated keeps its final observation; the unroll carries them as `final_obs`
    (see UnrollSpec), since the step's successor in `obs` is then the next episode's first observation.
    With a recurrent core, `observe` is given the stream's core input before the step (`core`) and keeps
    it when that step is an unroll's step 0, the bootstrap step T included: it is step 0 of the next one.
    """

    def __init__(self, spec: UnrollSpec, version: Callable[[], int] = lambda: -1):
        self.T = spec.unroll_length
        # The policy version acting now (the actor's), and the one that chose the open unroll's step 0:
        # the oldest that acted in it, which stamps it (`finished_version`: of the last unroll returned).
        self.version = version
        self.first_version = self.finished_version = -1
        self.arrays = {name: np.zeros(shape, dtype) for name, (dtype, shape) in spec.arrays.items()}
        self.final_spec = spec.final_arrays
        self.stepped = [name for name in self.arrays if name.startswith("obs") or name == "action_mask"]  # T+1 long
        self.behaviour = "behaviour_logits" if "behaviour_logits" in self.arrays else "behaviour_log_probs"
        self.n = 0  # observed steps in the current unroll
        self.finals: dict[int, np.ndarray | dict[str, np.ndarray]] = {}  # step -> final observation

    def observe(self, obs: np.ndarray | dict[str, np.ndarray], action_mask: np.ndarray,
                core: tuple[np.ndarray, int, float] | None = None) -> dict[str, np.ndarray] | None:
        """obs: one array, or a dict of named arrays (stored as `obs.<name>`, see UnrollSpec). core: the
        stream's (state [2, core_size], last action, last reward) before this step, with a recurrent core."""
        a = self.arrays
        if self.n == 0 and core is not None:
            self._keep_core(core)
        for name, value in (obs.items() if isinstance(obs, dict) else [("", obs)]):
            a[f"obs.{name}" if name else "obs"][self.n] = value
        a["action_mask"][self.n] = action_mask
        self.n += 1
        if self.n <= self.T:
            return None
        # The finished unroll keeps these arrays (no copy); the next one gets new ones, whose every row
        # is written before it is returned: the stepped arrays' rows 0..T (row 0 below), the others' by
        # record_action and _keep_core.
        unroll = a
        self.arrays = {name: np.empty_like(array) for name, array in a.items()}
        for name in self.stepped:
            self.arrays[name][0] = a[name][self.T]
        unroll.update(self._final_arrays())
        self.finished_version = self.first_version
        self.n = 1
        self.finals = {}
        if core is not None:
            self._keep_core(core)
        return unroll

    def _keep_core(self, core: tuple[np.ndarray, int, float]) -> None:
        state, last_action, last_reward = core
        self.arrays["core_state"][0] = state
        self.arrays["last_action"][0] = last_action
        self.arrays["last_reward"][0] = last_reward

    def _final_arrays(self) -> dict[str, np.ndarray]:
        """`final_obs` ([N, ...] per name) of this unroll's truncated steps, in step order; none when N = 0."""
        steps = sorted(self.finals)
        out: dict[str, np.ndarray] = {}
        if not steps:
            return out
        for name, (dtype, shape) in self.final_spec.items():
            key = name[len("final_obs."):] if "." in name else None
            rows = [self.finals[t][key] if key else self.finals[t] for t in steps]
            out[name] = np.stack(rows).astype(dtype, copy=False)
        return out

    def record_action(self, action: int | np.ndarray, behaviour: np.ndarray) -> None:
        """The action taken at the open step and mu's record of it (logits, or per-head log-probs)."""
        t = self.n - 1
        if t == 0:
            self.first_version = self.version()
        self.arrays["action"][t] = action
        self.arrays[self.behaviour][t] = behaviour
        self.arrays["reward"][t] = 0.0
        self.arrays["done"][t] = 0
        self.arrays["truncated"][t] = 0
        self.finals.pop(t, None)

    def settle(self, reward: float, done: bool, truncated: bool = False,
               final_observation: np.ndarray | dict[str, np.ndarray] | None = None) -> None:
        """Add `reward` to the open step and set its end flags; a truncated step needs its final
        observation (raises ValueError without one)."""
        t = self.n - 1
        self.arrays["reward"][t] += reward
        self.arrays["done"][t] = done or truncated
        self.arrays["truncated"][t] = truncated
        if truncated:
            if final_observation is None:
                raise ValueError("a truncated step needs the final observation its value is bootstrapped from")
            self.finals[t] = final_observation
        else:
            self.finals.pop(t, None)
