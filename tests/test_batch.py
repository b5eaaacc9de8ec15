"""The learner's batch record (impala_league/batch.py): unrolls stacked time-major and back, final
observations in step order, values that survive the stacking."""

from __future__ import annotations

import numpy as np
import torch

from impala_league.batch import Batch, as_entry, stack_entries, unstack
from impala_league.envs.registry import env_spec
from tests.distributed.test_faults import T, valid_unroll


def test_reward_on_the_last_step_survives_batch_assembly():
    """T=4, rewards [0, 0, 0, 1], the episode ends at t=3: vs = pg_advantages = [0.970299, 0.9801, 0.99, 1]."""
    from impala_league.distributed import vtrace
    from impala_league.distributed.actor import UnrollBuffer
    from impala_league.distributed.wire.codec import UnrollSpec

    spec = env_spec("tictactoe")
    buffers = [UnrollBuffer(UnrollSpec(spec, 4)) for _ in range(2)]
    unrolls = []
    for buf in buffers:
        for t in range(5):
            got = buf.observe(np.zeros((3, 3, 2), np.int8), np.ones(9, np.uint8))
            if got is not None:
                unrolls.append(got)
                break
            buf.record_action(t, np.zeros(9, np.float32))
            buf.settle(1.0 if t == 3 else 0.0, t == 3)
    batch = Batch.stack(unrolls, torch.device("cpu"))
    assert batch.reward.shape == (4, 2) and batch.reward[-1].tolist() == [1.0, 1.0]
    discounts = (~batch.done).float() * 0.99
    zeros = torch.zeros(4, 2)
    out = vtrace.from_logits(batch.behaviour_logits, batch.behaviour_logits, batch.action, discounts, batch.reward,
                             zeros, torch.zeros(2))
    expected = torch.tensor([0.970299, 0.9801, 0.99, 1.0]).unsqueeze(1).expand(4, 2)
    torch.testing.assert_close(out.vs, expected)
    torch.testing.assert_close(out.pg_advantages, expected)


def test_a_stacked_batch_moves_to_the_device_unchanged():
    unrolls = [valid_unroll(1.0), valid_unroll(-1.0), valid_unroll(0.5)]
    batch = Batch.stack(unrolls, torch.device("cpu"))
    moved = batch.to(torch.device("cpu"))
    assert moved.obs.shape == (T + 1, 3, *unrolls[0]["obs"].shape[1:])
    np.testing.assert_array_equal(moved.reward[0].numpy(), [1.0, -1.0, 0.5])
    assert moved.done.dtype == torch.bool


def test_from_arrays_shares_the_stacked_memory_and_finds_each_final_observations_step():
    """Two unrolls of T=3, unroll 0 truncated at t=1, unroll 1 at t=0 and t=2: final observations are
    stacked unroll after unroll, in step order, and each row points at its own (t, b)."""
    def unroll(u: int, truncated: list[int]) -> dict[str, np.ndarray]:
        n = sum(truncated)
        return {"obs": np.full((4, 2), u, np.int8), "action_mask": np.ones((4, 3), np.uint8),
                "action": np.arange(3, dtype=np.int64) + 10 * u, "reward": np.full(3, float(u), np.float32),
                "done": np.array(truncated, np.uint8), "truncated": np.array(truncated, np.uint8),
                "behaviour_logits": np.zeros((3, 3), np.float32),
                "final_obs": np.arange(n * 2, dtype=np.int8).reshape(n, 2) + 100 * u}

    unrolls = [unroll(0, [0, 1, 0]), unroll(1, [1, 0, 1])]
    arrays = stack_entries([as_entry(u) for u in unrolls])
    batch = Batch.from_arrays(arrays, torch.device("cpu"))
    assert batch.obs.shape == (4, 2, 2) and batch.action[:, 1].tolist() == [10, 11, 12]
    assert batch.final_t.tolist() == [1, 0, 2] and batch.final_b.tolist() == [0, 1, 1]
    assert batch.final_obs.tolist() == [[0, 1], [100, 101], [102, 103]]
    assert np.shares_memory(batch.reward.numpy(), arrays["reward"])  # no copy on the CPU
    back = unstack(arrays)
    assert [u["final_obs"].tolist() for u in back] == [[[0, 1]], [[100, 101], [102, 103]]]
    assert batch.map(lambda x: x + 0).core_state is None  # None stays None
