"""pysc2's FunctionCall action space as one function-id head plus one categorical head per argument type.

SC2LE (Vinyals et al. 2017, section 4.2): an action is a function id `a_0` and the arguments that
function takes; pi(a|s) = pi(a_0|s) * prod_l pi(a_l|s) over the argument types l the function uses.
Heads, in this order (the columns of an encoded action):

  0  function          573 function ids, masked by `available_actions`
  1  screen            S*S pixels  (y * S + x; pysc2's argument is [x, y])
  2  minimap           M*M pixels
  3  screen2           S*S pixels  (second corner of a rectangle select)
  4+ queued (2), control_group_act (5), control_group_id (10), select_point_act (4), select_add (2),
     select_unit_act (4), select_unit_id (500), select_worker (4), build_queue_id (10), unload_id (500)

An encoded action is int64 [..., 14]; columns of heads the function does not use hold 0. Its
log-prob is the sum of the log-probs of the heads the function uses, so V-trace's
log_rho = log pi(a|s) - log mu(a|s) is the sum of per-head log-ratios over those heads. Entropy is
summed the same way over the heads the *taken* function uses (argument heads of functions not taken
do not shape the behaviour, so rewarding their entropy would only spread them for nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from pysc2.lib import actions as sc2_actions

FUNCTION = "function"
NUM_FUNCTIONS = len(sc2_actions.FUNCTIONS)
SPATIAL = ("screen", "minimap", "screen2")


@dataclass(frozen=True)
class Head:
    """One categorical head: `name` (pysc2's argument type, or 'function'), `size` choices, and for a
    spatial head the square `side` of its feature layer (choice i is pixel x = i % side, y = i // side)."""

    name: str
    size: int
    side: int | None = None


class FunctionCallCodec:
    """Heads, sampling, log-probs and FunctionCall conversion for one screen / minimap resolution.

    Args:
      screen_size, minimap_size: feature layer sides in pixels (the env's AgentInterfaceFormat).
    """

    def __init__(self, screen_size: int, minimap_size: int):
        heads = [Head(FUNCTION, NUM_FUNCTIONS)]
        for t in sc2_actions.TYPES:
            side = {"screen": screen_size, "screen2": screen_size, "minimap": minimap_size}.get(t.name)
            size = side * side if side else int(t.sizes[0])
            heads.append(Head(t.name, size, side))
        self.heads: tuple[Head, ...] = tuple(heads)
        self._column = {h.name: i for i, h in enumerate(self.heads)}
        uses = np.zeros((NUM_FUNCTIONS, len(self.heads)), dtype=bool)
        uses[:, 0] = True
        for f in sc2_actions.FUNCTIONS:
            for arg in f.args:
                uses[int(f.id), self._column[arg.name]] = True
        self.uses = torch.from_numpy(uses)  # bool [573, 14]: function f uses head h

    @property
    def num_heads(self) -> int:
        return len(self.heads)

    def used_heads(self, functions: torch.Tensor) -> torch.Tensor:
        """functions int64 [...] -> bool [..., num_heads]: the heads each function's action uses."""
        return self.uses.to(functions.device)[functions]

    def zero_unused(self, actions: torch.Tensor) -> torch.Tensor:
        """actions int64 [N, num_heads] -> the same with 0 in the heads each row's function does not use
        (an encoded action's canonical form; agents.heads.FunctionCallHead draws every head, then this)."""
        return torch.where(self.used_heads(actions[:, 0]), actions, torch.zeros_like(actions))

    def head_log_probs(self, logits: list[torch.Tensor], actions: torch.Tensor) -> torch.Tensor:
        """log pi_h(a_h|s) per head, 0 for heads the action's function does not use.

        logits: per head float [..., size]; actions int64 [..., num_heads]. Returns float [..., num_heads].
        """
        per_head = torch.stack([torch.log_softmax(lg, -1).gather(-1, actions[..., i:i + 1]).squeeze(-1)
                                for i, lg in enumerate(logits)], -1)
        return per_head * self.used_heads(actions[..., 0])

    def log_prob(self, logits: list[torch.Tensor], actions: torch.Tensor) -> torch.Tensor:
        """log pi(a|s) = sum over used heads of log pi_h(a_h|s). Shapes as `head_log_probs`; returns [...]."""
        return self.head_log_probs(logits, actions).sum(-1)

    def entropy(self, logits: list[torch.Tensor], functions: torch.Tensor) -> torch.Tensor:
        """Sum of the entropies of the function head and of the argument heads `functions` [...] use.

        Masked logits (MASKED_LOGIT) give exactly 0 probability and finite terms. Returns float [...].
        """
        per_head = []
        for lg in logits:
            log_p = torch.log_softmax(lg, -1)
            per_head.append(-(log_p.exp() * log_p).sum(-1))
        return (torch.stack(per_head, -1) * self.used_heads(functions)).sum(-1)

    def to_function_call(self, action: np.ndarray) -> sc2_actions.FunctionCall:
        """An encoded action int [num_heads] -> pysc2 FunctionCall (spatial arguments as [x, y])."""
        function = sc2_actions.FUNCTIONS[int(action[0])]
        args = []
        for arg in function.args:
            head = self.heads[self._column[arg.name]]
            value = int(action[self._column[arg.name]])
            args.append([value % head.side, value // head.side] if head.side else [value])
        return sc2_actions.FunctionCall(function.id, args)

    def from_function_call(self, call: sc2_actions.FunctionCall) -> np.ndarray:
        """pysc2 FunctionCall -> encoded action int64 [num_heads] (0 in the heads it does not use).

        Raises ValueError if an argument is out of its head's range.
        """
        action = np.zeros(self.num_heads, dtype=np.int64)
        action[0] = int(call.function)
        for arg, value in zip(sc2_actions.FUNCTIONS[int(call.function)].args, call.arguments):
            head = self.heads[self._column[arg.name]]
            index = int(value[1]) * head.side + int(value[0]) if head.side else int(value[0])
            if not 0 <= index < head.size or (head.side and not 0 <= int(value[0]) < head.side):
                raise ValueError(f"{call}: argument {arg.name}={list(value)} is outside its {head.size} choices")
            action[self._column[arg.name]] = index
        return action

