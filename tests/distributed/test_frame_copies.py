"""Frames between the emulator and the wire are copied once, into the unroll (bench/bench_atari_env.py
lists every copy): a finished unroll keeps its buffer's arrays, and a vector env's batch of
observations is the forward pass's input as it is."""

from __future__ import annotations

import numpy as np

from impala_league.distributed.actor import UnrollBuffer, stacked
from impala_league.distributed.wire.codec import UnrollSpec
from impala_league.envs.registry import env_spec, make_envs

T = 3


def test_a_finished_unroll_keeps_the_buffer_s_arrays_and_the_next_one_starts_from_its_step_t():
    spec = env_spec("connect_four")
    buffer = UnrollBuffer(UnrollSpec(spec, T))
    mask = np.ones(spec.num_actions, np.uint8)
    observations = [np.full(spec.obs_shape, t, spec.obs_dtype) for t in range(2 * T + 1)]
    unrolls = []
    for t, obs in enumerate(observations):
        before = buffer.arrays["obs"]
        if (unroll := buffer.observe(obs, mask)) is not None:
            assert unroll["obs"] is before  # handed over, not copied
            unrolls.append(unroll)
        buffer.record_action(t % spec.num_actions, np.zeros(spec.num_actions, np.float32))
        buffer.settle(float(t), False)
    first, second = unrolls
    # Writing the second unroll did not touch the first: each step holds its own observation.
    assert [int(o.flat[0]) for o in first["obs"]] == [0, 1, 2, 3]
    assert [int(o.flat[0]) for o in second["obs"]] == [3, 4, 5, 6]
    assert first["reward"].tolist() == [0.0, 1.0, 2.0] and second["reward"].tolist() == [3.0, 4.0, 5.0]
    assert first["action"].tolist() == [0, 1, 2] and second["action"].tolist() == [3, 4, 5]
    assert not np.shares_memory(first["obs"], buffer.arrays["obs"])


def test_stacked_is_the_vector_env_s_own_array_when_every_slot_acts_in_order():
    envs = make_envs("atari:Pong", [0, 1, 2], {"emulator": "ale_vector"})
    observations = [env.advance().observations[0] for env in envs]
    batch = stacked(observations)
    assert batch.shape == (3, 4, 84, 84) and batch.dtype == np.uint8
    assert all(np.shares_memory(batch, o) for o in observations)  # no copy
    np.testing.assert_array_equal(batch, np.stack(observations))
    for part in (observations[::-1], observations[:2], [observations[0]] * 3):  # other orders and counts
        got = stacked(part)
        assert not np.shares_memory(got, observations[0])
        np.testing.assert_array_equal(got, np.stack(part))
    envs[0].group.close()
