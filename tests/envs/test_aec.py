"""The AEC adapter and the actor's unroll buffers: which step each reward lands on."""

from __future__ import annotations

import numpy as np
import pytest

from impala_league.distributed.actor import UnrollBuffer
from impala_league.distributed.wire.codec import UnrollSpec
from impala_league.envs.registry import env_spec, make_env


def play(adapter, moves):
    """Play `moves` (alternating seats) and return (events, final turn): events is a list of
    ("turn", seat) and ("settle", seat, reward, done) in the order the adapter produced them."""
    events = []
    turn = adapter.advance()
    for move in moves:
        events.append(("turn", turn.agents[0]))
        adapter.act([move])
        turn = adapter.advance()
        events += [("settle", s.agent, s.reward, s.done) for s in turn.settlements]
    return events, turn


def test_connect_four_vertical_win_settles_both_seats_once():
    # player_0 drops in column 0, player_1 in column 1: player_0 wins on move 7 (its 4th).
    adapter = make_env("connect_four", seed=0)
    events, turn = play(adapter, [0, 1, 0, 1, 0, 1, 0])
    settles = [e for e in events if e[0] == "settle"]
    # Each move is settled when its seat next observes; the game's end settles the last two moves.
    seat0 = [e for e in settles if e[1] == 0]
    seat1 = [e for e in settles if e[1] == 1]
    assert [(r, d) for _, _, r, d in seat0] == [(0.0, False)] * 3 + [(1.0, True)]
    assert [(r, d) for _, _, r, d in seat1] == [(0.0, False)] * 2 + [(-1.0, True)]
    assert len(turn.episodes) == 1
    assert turn.episodes[0].returns == (1.0, -1.0)
    assert turn.episodes[0].length == 7
    assert turn.episodes[0].winner == 0
    # Play goes on in a fresh game: an empty board, seat 0 to move.
    assert turn.agents == [0] and turn.observations[0].sum() == 0


def test_connect_four_streams_end_with_reward_and_done_and_no_extra_step():
    spec = env_spec("connect_four")
    buffers = [UnrollBuffer(UnrollSpec(spec, 4)), UnrollBuffer(UnrollSpec(spec, 3))]
    adapter = make_env("connect_four", seed=0)
    turn = adapter.advance()
    finished = [[], []]
    logits = np.zeros(7, np.float32)
    moves = iter([0, 1, 0, 1, 0, 1, 0])
    for _ in range(7):
        seat = turn.agents[0]
        for s in turn.settlements:
            buffers[s.agent].settle(s.reward, s.done)
        out = buffers[seat].observe(turn.observations[0], turn.action_masks[0])
        if out is not None:
            finished[seat].append(out)
        move = next(moves)
        buffers[seat].record_action(move, logits)
        adapter.act([move])
        turn = adapter.advance()
    for s in turn.settlements:
        buffers[s.agent].settle(s.reward, s.done)
    # An observation of the next game completes both unrolls (T=4 for seat 0, T=3 for seat 1).
    for seat in (0, 1):
        finished[seat].append(buffers[seat].observe(turn.observations[0], turn.action_masks[0]))
    u0, u1 = finished[0][0], finished[1][0]
    np.testing.assert_array_equal(u0["action"], [0, 0, 0, 0])
    np.testing.assert_array_equal(u0["reward"], [0, 0, 0, 1])
    np.testing.assert_array_equal(u0["done"], [0, 0, 0, 1])
    np.testing.assert_array_equal(u1["action"], [1, 1, 1])
    np.testing.assert_array_equal(u1["reward"], [0, 0, -1])
    np.testing.assert_array_equal(u1["done"], [0, 0, 1])
    # Observations are from the mover's perspective (channel 0 = own pieces): before its 3rd move
    # seat 1 has 2 pieces in column 1 and the opponent 3 in column 0.
    assert u1["obs"][2][..., 0].sum() == 2 and u1["obs"][2][..., 1].sum() == 3
    assert u0["obs"][3][5, 0, 0] == 1 and u0["obs"][3][..., 0].sum() == 3


def test_unroll_buffer_carries_the_bootstrap_step_into_the_next_unroll():
    spec = UnrollSpec(env_spec("tictactoe"), 2)
    buf = UnrollBuffer(spec)
    mask = np.ones(9, np.uint8)
    out = []
    for t in range(5):
        obs = np.full((3, 3, 2), t, np.int8)
        got = buf.observe(obs, mask)
        if got is not None:
            out.append(got)
        buf.record_action(t, np.full(9, t, np.float32))
        buf.settle(float(t), t == 1)
    assert len(out) == 2
    np.testing.assert_array_equal(out[0]["obs"][:, 0, 0, 0], [0, 1, 2])
    np.testing.assert_array_equal(out[1]["obs"][:, 0, 0, 0], [2, 3, 4])
    np.testing.assert_array_equal(out[0]["reward"], [0, 1])
    np.testing.assert_array_equal(out[0]["done"], [0, 1])
    np.testing.assert_array_equal(out[1]["action"], [2, 3])
    np.testing.assert_array_equal(out[1]["behaviour_logits"][:, 0], [2, 3])


def test_tictactoe_draw_has_no_winner_and_zero_rewards():
    adapter = make_env("tictactoe", seed=0)
    # X: 0 1 5 6 8 (cells by observation index), O: 2 3 4 7 -> full board, no line.
    events, turn = play(adapter, [0, 2, 1, 3, 5, 4, 6, 7, 8])
    assert turn.episodes and turn.episodes[0].winner is None
    assert turn.episodes[0].returns == (0.0, 0.0)
    finals = [e for e in events if e[0] == "settle" and e[3]]
    assert sorted(e[1] for e in finals) == [0, 1] and all(e[2] == 0 for e in finals)


def test_unknown_env_names_the_choices():
    with pytest.raises(ValueError, match="connect_four"):
        make_env("conect_four", seed=0)


@pytest.mark.parametrize("action", [3, 7, -1])
def test_an_illegal_or_out_of_range_move_is_refused_and_the_game_goes_on(action):
    # Board games step PettingZoo's raw env, without its checking wrappers: the adapter refuses
    # the move itself, names the legal ones, and the position is unchanged.
    adapter = make_env("connect_four", seed=0)
    _, turn = play(adapter, [3] * 6)  # column 3 is full
    assert turn.action_masks[0][3] == 0
    with pytest.raises(ValueError, match=r"illegal action .*legal actions are \[0, 1, 2, 4, 5, 6\]"):
        adapter.act([action])
    adapter.act([0])
    after = adapter.advance()
    assert after.agents == [1] and not after.episodes
    assert after.observations[0][5, 0].tolist() == [0, 1]  # seat 1's view: seat 0's piece in (5, 0)
