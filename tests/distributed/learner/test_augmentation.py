"""The board's mirror as data augmentation (impala_league/distributed/learner/augmentation.py): boards, actions, masks,
behaviour logits and final observations reflected together; `random` and `both`; games without one."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from impala_league.batch import Batch
from impala_league.distributed.learner.augmentation import Mirror, mirrored, randomly_mirrored
from impala_league.envs.registry import env_spec
from tests.distributed.test_faults import T, valid_unroll


def test_mirror_reflects_boards_actions_and_masks_consistently():
    spec = env_spec("connect_four")
    T, B, A = 3, 2, 7
    g = torch.Generator().manual_seed(1)
    obs = torch.randint(0, 2, (T + 1, B, 6, 7, 2), generator=g, dtype=torch.int8)
    mask = torch.randint(0, 2, (T + 1, B, A), generator=g, dtype=torch.uint8)
    mask[..., 2] = 1
    action = torch.full((T, B), 2, dtype=torch.int64)
    logits = torch.randn(T, B, A, generator=g)
    batch = Batch(obs, mask, action, torch.randn(T, B), torch.zeros(T, B, dtype=torch.bool), logits)
    m = mirrored(batch, spec)
    assert m.obs.shape[1] == 2 * B
    torch.testing.assert_close(m.obs[:, B:, :, 0], obs[:, :, :, 6])  # column 0 of the mirror = column 6
    assert (m.action[:, B:] == 4).all()  # column 2 -> column 4
    torch.testing.assert_close(m.action_mask[:, B:, 4], mask[..., 2])
    torch.testing.assert_close(m.behaviour_logits[:, B:, 0], logits[..., 6])
    torch.testing.assert_close(m.reward[:, B:], batch.reward)


def test_random_mirror_reflects_the_chosen_unrolls_and_keeps_their_final_observations():
    """flip [F, T, F]: unrolls 0 and 2 stay, unroll 1 is reflected; each truncated step keeps the final
    observation of its own unroll, reflected with it; the batch stays B unrolls wide."""
    spec = env_spec("connect_four")
    T, B, A = 3, 3, 7
    g = torch.Generator().manual_seed(2)
    obs = torch.randint(0, 2, (T + 1, B, 6, 7, 2), generator=g, dtype=torch.int8)
    mask = torch.randint(0, 2, (T + 1, B, A), generator=g, dtype=torch.uint8)
    action = torch.randint(0, A, (T, B), generator=g)
    logits = torch.randn(T, B, A, generator=g)
    truncated = torch.zeros(T, B, dtype=torch.bool)
    truncated[2, 1] = truncated[0, 2] = True
    final_obs = torch.randint(0, 2, (2, 6, 7, 2), generator=g, dtype=torch.int8)
    batch = Batch(obs, mask, action, torch.randn(T, B), truncated.clone(), logits, truncated=truncated,
                  final_obs=final_obs, final_t=torch.tensor([2, 0]), final_b=torch.tensor([1, 2]))
    m = randomly_mirrored(batch, spec, torch.tensor([False, True, False]))
    assert m.obs.shape == obs.shape and m.action.shape == (T, B)
    for b in (0, 2):
        torch.testing.assert_close(m.obs[:, b], obs[:, b])
        torch.testing.assert_close(m.action[:, b], action[:, b])
    torch.testing.assert_close(m.obs[:, 1], obs[:, 1].flip(2))
    assert m.action[:, 1].tolist() == [6 - a for a in action[:, 1].tolist()]
    torch.testing.assert_close(m.action_mask[:, 1], mask[:, 1].flip(-1))
    torch.testing.assert_close(m.behaviour_logits[:, 1], logits[:, 1].flip(-1))
    final = {(int(t), int(b)): o for t, b, o in zip(m.final_t, m.final_b, m.final_obs)}
    assert set(final) == {(2, 1), (0, 2)}
    torch.testing.assert_close(final[(2, 1)], final_obs[0].flip(1))  # reflected with unroll 1
    torch.testing.assert_close(final[(0, 2)], final_obs[1])
    assert m.truncated.tolist() == truncated.tolist()


def test_tictactoe_mirror_maps_actions_like_the_board():
    spec = env_spec("tictactoe")
    # Cell (row 0, col 0) = action 0 reflects to (row 0, col 2) = action 2; centre column stays.
    assert spec.mirror_actions[0] == 2 and spec.mirror_actions[4] == 4 and spec.mirror_actions[5] == 3
    assert sorted(spec.mirror_actions) == list(range(9))


def test_an_actors_own_unrolls_without_final_observations_stack_and_mirror():
    """A3C workers stack their own buffers' unrolls, which leave `final_obs` out when no step is
    truncated: the batch then has N = 0 final observations, also after the board's mirror."""
    unrolls = [dict(valid_unroll(1.0), truncated=np.zeros(T, np.uint8)) for _ in range(2)]
    batch = Batch.stack(unrolls, torch.device("cpu"))
    assert batch.final_obs.shape == (0, *unrolls[0]["obs"].shape[1:]) and batch.final_t.shape == (0,)
    mirrored_batch = mirrored(batch, env_spec("tictactoe"))
    assert mirrored_batch.final_obs.shape[0] == 0 and mirrored_batch.reward.shape == (T, 4)


def test_mirror_augment_is_none_without_a_mirror_and_random_draws_are_seeded():
    """`random` flips each unroll with probability 1/2 from the seed's own generator: the same seed
    reflects the same unrolls; a game without a mirror (EnvSpec.mirror_actions None) is left as it is."""
    spec = env_spec("tictactoe")
    T, B, A = 2, 16, spec.num_actions
    obs = torch.arange(B, dtype=torch.int8).view(1, B, 1, 1, 1).expand(T + 1, B, 3, 3, 2).contiguous()
    batch = Batch(obs, torch.ones(T + 1, B, A, dtype=torch.uint8), torch.zeros(T, B, dtype=torch.int64),
                  torch.zeros(T, B), torch.zeros(T, B, dtype=torch.bool), torch.zeros(T, B, A))
    cpu = torch.device("cpu")
    first, again = (Mirror(spec, "random", cpu, seed=3)(batch) for _ in range(2))
    flipped = first.action[0] == 2  # action 0 (row 0, col 0) reflects to 2
    assert 0 < int(flipped.sum()) < B
    assert torch.equal(first.action, again.action)
    assert torch.equal(first.obs, batch.obs)  # these boards are the same in every column: the flip keeps them
    assert Mirror(spec, "both", cpu, seed=0)(batch).reward.shape == (T, 2 * B)
    plain = SimpleNamespace(mirror_actions=None, mirror_axis=0)
    assert Mirror(plain, "both", cpu, seed=0).mode == "none" and Mirror(plain, "both", cpu, seed=0)(batch) is batch
