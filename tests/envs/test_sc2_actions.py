"""FunctionCall codec: round trips, masked function ids, and the summed log-prob of the heads used."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import impala_league.envs.sc2_wrappers  # noqa: F401  (imports pysc2 through the shim)
from impala_league.agents.heads import FunctionCallHead
from impala_league.agents.network import mask_logits
from impala_league.envs.sc2_wrappers.actions import NUM_FUNCTIONS, FunctionCallCodec
from pysc2.lib import actions as sc2_actions

CODEC = FunctionCallCodec(screen_size=4, minimap_size=3)
HEAD = FunctionCallHead(CODEC)
COLUMN = {h.name: i for i, h in enumerate(CODEC.heads)}


def _logits(n: int, available: list[int], generator: torch.Generator) -> list[torch.Tensor]:
    mask = torch.zeros(n, NUM_FUNCTIONS, dtype=torch.uint8)
    mask[:, available] = 1
    out = [mask_logits(torch.randn(n, NUM_FUNCTIONS, generator=generator), mask)]
    return out + [torch.randn(n, h.size, generator=generator) for h in CODEC.heads[1:]]


def test_heads_follow_pysc2_argument_types():
    assert [(h.name, h.size) for h in CODEC.heads][:5] == [
        ("function", 573), ("screen", 16), ("minimap", 9), ("screen2", 16), ("queued", 2)]
    assert CODEC.num_heads == 14
    # select_rect (3) uses select_add, screen, screen2; no_op (0) only the function head.
    assert np.flatnonzero(CODEC.uses[3].numpy()).tolist() == [0, COLUMN["screen"], COLUMN["screen2"],
                                                              COLUMN["select_add"]]
    assert np.flatnonzero(CODEC.uses[0].numpy()).tolist() == [0]


def test_masked_function_ids_are_never_sampled_and_unused_heads_hold_zero():
    generator = torch.Generator().manual_seed(0)
    available = [0, 1, 2, 3, 7, 12, 451, 452]
    drawn = HEAD.draw(_logits(5000, available, generator), generator)
    assert set(drawn[:, 0].tolist()) == set(available)  # every available id is drawn, nothing else
    used = CODEC.used_heads(drawn[:, 0])
    assert (drawn[~used] == 0).all()
    assert (drawn[drawn[:, 0] == 3][:, COLUMN["screen2"]] > 0).any()


def test_round_trip_sampled_action_to_function_call_and_back():
    generator = torch.Generator().manual_seed(1)
    drawn = HEAD.draw(_logits(300, [0, 1, 2, 3, 7, 12, 452], generator), generator).numpy()
    for action in drawn:
        call = CODEC.to_function_call(action)
        assert np.array_equal(CODEC.from_function_call(call), action)
    # Pixel 9 of a 4x4 screen is column x = 1, row y = 2; pysc2 takes [x, y].
    call = CODEC.to_function_call(np.array([12, 9] + [0] * 2 + [1] + [0] * 9))
    assert call.function == 12 and [list(a) for a in call.arguments] == [[1], [1, 2]]
    with pytest.raises(ValueError, match="screen=\\[4, 0\\] is outside"):
        CODEC.from_function_call(sc2_actions.FunctionCall(12, [[0], [4, 0]]))


def test_log_prob_and_entropy_sum_the_heads_the_function_uses():
    # Attack_screen (12) with queued=1 at screen pixel 5; functions 0, 2 and 12 available with equal logits.
    mask = torch.zeros(1, NUM_FUNCTIONS, dtype=torch.uint8)
    mask[0, [0, 2, 12]] = 1
    logits = [mask_logits(torch.zeros(1, NUM_FUNCTIONS), mask)]
    for head in CODEC.heads[1:]:
        logits.append(torch.randn(1, head.size) * 5)  # unused heads: any values, they must not count
    logits[COLUMN["queued"]] = torch.tensor([[0.0, math.log(3.0)]])
    screen = torch.zeros(1, 16)
    screen[0, 5] = math.log(2.0)
    logits[COLUMN["screen"]] = screen
    action = torch.zeros(1, 14, dtype=torch.long)
    action[0, 0], action[0, COLUMN["queued"]], action[0, COLUMN["screen"]] = 12, 1, 5
    expected = math.log(1 / 3) + math.log(3 / 4) + math.log(2 / 17)
    assert CODEC.log_prob(logits, action).item() == pytest.approx(expected, abs=1e-6)
    per_head = CODEC.head_log_probs(logits, action)[0]
    assert per_head[COLUMN["minimap"]] == 0 and per_head[COLUMN["select_add"]] == 0
    entropy = (math.log(3)  # uniform over 3 available functions; masked ones add exactly 0
               - (0.25 * math.log(0.25) + 0.75 * math.log(0.75))
               - (2 / 17 * math.log(2 / 17) + 15 / 17 * math.log(1 / 17)))
    assert CODEC.entropy(logits, action[:, 0]).item() == pytest.approx(entropy, abs=1e-5)
    assert torch.isfinite(CODEC.entropy(logits, torch.tensor([0]))).all()
