"""Networks: masking gives zero probability to illegal actions with finite numbers; sampling obeys masks."""

from __future__ import annotations

import pytest
import torch

from impala_league.agents.heads import sample_actions
from impala_league.agents.network import MASKED_LOGIT, ActorCritic
from impala_league.config import AgentConfig


def test_masked_actions_are_never_sampled_and_frequencies_follow_softmax():
    logits = torch.tensor([[0.0, MASKED_LOGIT, torch.log(torch.tensor(3.0)).item(), MASKED_LOGIT]]).repeat(20000, 1)
    actions = sample_actions(logits, torch.Generator().manual_seed(0))
    counts = torch.bincount(actions, minlength=4).float() / len(actions)
    assert counts[1] == 0 and counts[3] == 0
    assert abs(counts[2].item() - 0.75) < 0.015  # softmax([0, log 3]) = [0.25, 0.75]


def test_a_temperature_sharpens_sampling_and_zero_is_the_argmax():
    logits = torch.tensor([[0.0, MASKED_LOGIT, torch.log(torch.tensor(3.0)).item(), MASKED_LOGIT]]).repeat(20000, 1)
    actions = sample_actions(logits, torch.Generator().manual_seed(0), temperature=0.5)
    counts = torch.bincount(actions, minlength=4).float() / len(actions)
    assert counts[1] == 0 and counts[3] == 0
    assert abs(counts[2].item() - 0.9) < 0.01  # softmax([0, log 3] / 0.5) = softmax([0, log 9]) = [0.1, 0.9]
    assert (sample_actions(logits, torch.Generator().manual_seed(0), temperature=0.0) == 2).all()


def test_policy_masks_illegal_actions_with_finite_log_probs_and_entropy():
    torch.manual_seed(0)
    for cfg in (AgentConfig(torso="mlp", hidden=32), AgentConfig(torso="conv", channels=4, kernel_size=4,
                                                                 padding="valid", conv_layers=1, hidden=16)):
        model = ActorCritic((6, 7, 2), 7, cfg)
        obs = torch.randint(0, 2, (5, 6, 7, 2), dtype=torch.int8)
        mask = torch.zeros(5, 7, dtype=torch.uint8)
        mask[:, 2] = 1
        mask[0, :] = 1
        logits, value = model(obs, mask)
        log_pi = torch.log_softmax(logits, -1)
        entropy = -(log_pi.exp() * log_pi).sum(-1)
        assert torch.isfinite(log_pi).all() and torch.isfinite(entropy).all() and value.shape == (5,)
        # Rows with one legal action: it has probability 1 and the entropy is 0.
        torch.testing.assert_close(log_pi[1:, 2], torch.zeros(4), atol=1e-6, rtol=0)
        torch.testing.assert_close(entropy[1:], torch.zeros(4), atol=1e-6, rtol=0)
        entropy.sum().backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_explore_mixes_the_policy_with_uniform_legal_moves():
    from impala_league.agents.network import explore, mask_logits

    mask = torch.tensor([[1, 1, 0, 1], [1, 0, 0, 0]])
    logits = mask_logits(torch.tensor([[2.0, 0.0, 5.0, 1.0], [0.3, 0.0, 0.0, 0.0]]), mask)
    mu = torch.softmax(explore(logits, mask, torch.tensor([0.3, 0.5])), -1)
    pi = torch.softmax(logits, -1)
    torch.testing.assert_close(mu[0], 0.7 * pi[0] + 0.1 * torch.tensor([1.0, 1.0, 0.0, 1.0]))
    torch.testing.assert_close(mu[1], torch.tensor([1.0, 0.0, 0.0, 0.0]))  # one legal move stays certain
    # epsilon 0 leaves the policy unchanged.
    torch.testing.assert_close(torch.softmax(explore(logits, mask, torch.zeros(2)), -1), pi)


def test_landing_cells_mark_where_a_dropped_piece_would_land():
    """Connect four after columns 3, 3, 3, 0, 6, 6 (row 0 at the top): the landing cells are row 2 of
    column 3, row 3 of column 6, row 4 of column 0 and the bottom row elsewhere; a full column has none."""
    from pettingzoo.classic import connect_four_v3

    from impala_league.agents.torsos import landing_cells

    env = connect_four_v3.raw_env()
    env.reset(seed=0)
    for column in (3, 3, 3, 0, 6, 6):
        env.step(column)
    board = torch.tensor(env.observe(env.agent_selection)["observation"]).float()[None]
    expected = torch.zeros(6, 7)
    expected[5, [1, 2, 4, 5]] = 1
    expected[2, 3] = expected[3, 6] = expected[4, 0] = 1
    torch.testing.assert_close(landing_cells(board)[0, ..., 0], expected)
    full = torch.zeros(1, 6, 7, 2)
    full[0, :, 2, 0] = 1  # column 2 filled to the top
    got = landing_cells(full)[0, ..., 0]
    assert got[:, 2].sum() == 0 and got[5, [0, 1, 3, 4, 5, 6]].tolist() == [1.0] * 6


@pytest.mark.parametrize("landing, threats, in_channels", [(True, False, 3), (True, True, 5), (False, True, 4)])
def test_extra_plane_networks_take_the_plain_two_plane_board(landing, threats, in_channels):
    """The planes are computed inside the network: observations stay PettingZoo's [N, 6, 7, 2]."""
    cfg = AgentConfig(torso="conv", conv_layers=1, kernel_size=4, padding="valid", channels=8, hidden=16,
                      landing_plane=landing, threat_planes=threats)
    model = ActorCritic((6, 7, 2), 7, cfg)
    assert model.torso.conv[0].in_channels == in_channels
    logits, values = model(torch.zeros(5, 6, 7, 2, dtype=torch.int8), torch.ones(5, 7, dtype=torch.uint8))
    assert logits.shape == (5, 7) and values.shape == (5,) and torch.isfinite(logits).all()


def _threats_by_enumeration(board):
    """Reference for threat_cells: every window of four in the four directions, cell by cell."""
    h, w, _ = board.shape
    out = torch.zeros(h, w, 2)
    for r in range(h):
        for c in range(w):
            for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
                cells = [(r + i * dr, c + i * dc) for i in range(4)]
                if not all(0 <= y < h and 0 <= x < w for y, x in cells):
                    continue
                for p in (0, 1):
                    mine = [board[y, x, p] == 1 for y, x in cells]
                    theirs = [board[y, x, 1 - p] == 1 for y, x in cells]
                    if sum(mine) == 3 and not any(theirs):
                        y, x = cells[mine.index(False)]
                        out[y, x, p] = 1
    return out


def test_threat_cells_mark_the_empty_cell_of_each_three_in_a_row():
    """Row 0 at the top. Player 0 holds (5,0) (5,1) (5,2) and (5,6) (4,6) (3,6): threats (5,3) and (2,6).
    Player 1 holds (4,1) (3,2) (2,3), an anti-diagonal whose lower end (5,0) is player 0's, and (5,4),
    which blocks the window (5,1)-(5,4): its one threat is the upper end (1,4)."""
    from impala_league.agents.torsos import threat_cells

    board = torch.zeros(6, 7, 2)
    for r, c in ((5, 0), (5, 1), (5, 2), (5, 6), (4, 6), (3, 6)):
        board[r, c, 0] = 1
    for r, c in ((4, 1), (3, 2), (2, 3), (5, 4)):
        board[r, c, 1] = 1
    expected = torch.zeros(6, 7, 2)
    expected[5, 3, 0] = expected[2, 6, 0] = 1
    expected[1, 4, 1] = 1
    torch.testing.assert_close(threat_cells(board[None])[0], expected)
    torch.testing.assert_close(_threats_by_enumeration(board), expected)


def test_threat_cells_agree_with_enumeration_over_random_games():
    """Every position of 8 random connect-four games, as PettingZoo's observations, batched at once."""
    import numpy as np
    from pettingzoo.classic import connect_four_v3

    from impala_league.agents.torsos import threat_cells

    rng = np.random.default_rng(0)
    boards = []
    env = connect_four_v3.raw_env()
    for game in range(8):
        env.reset(seed=game)
        while not any(env.terminations.values()):
            obs = env.observe(env.agent_selection)
            boards.append(torch.tensor(obs["observation"]).float())
            env.step(int(rng.choice(np.flatnonzero(obs["action_mask"]))))
    batch = torch.stack(boards)
    got = threat_cells(batch)
    expected = torch.stack([_threats_by_enumeration(b) for b in batch])
    assert expected.sum() > 10  # the games do make threats
    torch.testing.assert_close(got, expected)
