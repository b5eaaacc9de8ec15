"""Tests for evaluation/bots.py; every position is reached by playing moves in the real env."""

from __future__ import annotations

import numpy as np
import pytest
from pettingzoo.classic import connect_four_v3, tictactoe_v3

import time

from impala_league.evaluation import bots
from impala_league.evaluation.bots import (
    CONNECT_FOUR,
    OPPONENT,
    TICTACTOE,
    TO_MOVE,
    WIN_SCORE,
    MinimaxBot,
    RandomBot,
    TacticalBot,
    make_bot,
)

ENVS = {"connect_four": connect_four_v3, "tictactoe": tictactoe_v3}
SEEDS = range(20)


def play(game: str, moves: list[int]):
    """Plays ``moves`` from the initial position; returns (env, observation, action_mask)."""
    env = ENVS[game].env()
    env.reset(seed=0)
    for move in moves:
        assert not any(env.terminations.values()), "setup sequence ended the game"
        env.step(move)
    obs, _, terminated, truncated, _ = env.last()
    assert not (terminated or truncated), "setup sequence ended the game"
    return env, obs["observation"], obs["action_mask"]


def tactical_choices(game: str, moves: list[int]) -> set[int]:
    """Actions the tactical bot picks in the position after ``moves``, over many seeds."""
    _, observation, mask = play(game, moves)
    return {TacticalBot(game, seed).act(observation, mask) for seed in SEEDS}


def mover_wins_with(game: str, moves: list[int], action: int) -> bool:
    """True if the player to move after ``moves`` wins the real game by playing ``action``."""
    env, _, _ = play(game, moves)
    mover = env.agent_selection
    env.step(action)
    return all(env.terminations.values()) and env.rewards[mover] == 1


def mirror(moves: list[int]) -> list[int]:
    """Connect-four moves reflected left-right (turns a diagonal into an anti-diagonal)."""
    return [6 - m for m in moves]


# Player 1 to move in each; the comment gives the winning move and the line it completes.
C4_HORIZONTAL = [0, 6, 1, 6, 2, 5]  # 3: row 5, cols 0-3
C4_VERTICAL = [0, 6, 0, 5, 0, 6]  # 0: col 0, rows 2-5
C4_DIAGONAL = [0, 1, 1, 2, 3, 2, 2, 3, 6, 3]  # 3: (5,0) (4,1) (3,2) (2,3)


@pytest.mark.parametrize(
    "moves, winning_move",
    [
        (C4_HORIZONTAL, 3),
        (C4_VERTICAL, 0),
        (C4_DIAGONAL, 3),
        (mirror(C4_DIAGONAL), 3),  # anti-diagonal
        (mirror(C4_HORIZONTAL), 3),
    ],
    ids=["horizontal", "vertical", "diagonal", "anti-diagonal", "horizontal-mirrored"],
)
def test_connect_four_takes_immediate_win(moves, winning_move):
    assert mover_wins_with("connect_four", moves, winning_move)  # the position is what we claim
    assert tactical_choices("connect_four", moves) == {winning_move}


def test_connect_four_blocks_opponent_win():
    # Player 2 holds (5,1) (5,2) (5,3) and threatens (5,4); player 1 has no win.
    moves = [0, 1, 0, 2, 6, 3]
    assert tactical_choices("connect_four", moves) == {4}


def test_connect_four_prefers_win_to_block():
    # Player 1 wins at col 0 (vertical); player 2 threatens col 4 (horizontal).
    moves = [0, 1, 0, 2, 0, 3]
    assert mover_wins_with("connect_four", moves, 0)
    assert tactical_choices("connect_four", moves) == {0}


def test_connect_four_breaks_ties_between_wins_at_random():
    # Player 1 holds (5,1) (5,2) (5,3): both col 0 and col 4 win.
    moves = [1, 1, 2, 2, 3, 3]
    assert mover_wins_with("connect_four", moves, 0)
    assert mover_wins_with("connect_four", moves, 4)
    assert tactical_choices("connect_four", moves) == {0, 4}


def test_connect_four_never_plays_a_full_column():
    # Columns 2 and 3 filled with alternating pieces: no win, no threat, 5 legal columns.
    moves = [3] * 6 + [2] * 6
    _, observation, mask = play("connect_four", moves)
    assert mask.tolist() == [1, 1, 0, 0, 1, 1, 1]
    picks = [TacticalBot("connect_four", seed).act(observation, mask) for seed in range(200)]
    assert set(picks) == {0, 1, 4, 5, 6}


def test_connect_four_does_not_block_a_threat_that_is_not_playable_yet():
    # The opponent's row-4 line (4,0) _ (4,2) (4,3) needs (4,1), but col 1 drops to (5,1): there
    # is nothing to win or block this ply, so every legal column must stay possible.
    moves = [0, 5, 0, 2, 2, 6, 4, 6, 2, 3, 3, 5, 3]
    _, observation, mask = play("connect_four", moves)
    board = CONNECT_FOUR.board_from_observation(observation)
    assert board[4][1] == 0 and board[5][1] == 0
    assert [board[4][c] for c in (0, 2, 3)] == [OPPONENT] * 3
    legal = CONNECT_FOUR.legal_moves(board)
    assert legal == list(range(7))
    assert CONNECT_FOUR.winning_moves(board, OPPONENT, legal) == []
    assert CONNECT_FOUR.winning_moves(board, TO_MOVE, legal) == []
    picks = {TacticalBot("connect_four", seed).act(observation, mask) for seed in range(100)}
    assert picks == set(range(7))


def random_positions(game: str, count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Observations [count, H, W, 2] and action masks [count, A] met in random games of the real env."""
    env = ENVS[game].env()
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    observations, masks = [], []
    while len(observations) < count:
        obs, _, terminated, truncated, _ = env.last()
        if terminated or truncated:
            env.reset()
            continue
        observations.append(obs["observation"])
        masks.append(obs["action_mask"])
        env.step(int(rng.choice(np.flatnonzero(obs["action_mask"]))))
    return np.stack(observations), np.stack(masks)


@pytest.mark.parametrize("game", ["connect_four", "tictactoe"])
def test_tactical_batch_plays_the_one_ply_tactics_of_each_position(game):
    observations, masks = random_positions(game, 400)
    picks = TacticalBot(game, 0).act_batch(observations, masks)
    g = bots.GAMES[game]
    kinds = set()
    for observation, mask, pick in zip(observations, masks, picks):
        board = g.board_from_observation(observation)
        legal = np.flatnonzero(mask).tolist()
        wins, threats = g.winning_moves(board, TO_MOVE, legal), g.winning_moves(board, OPPONENT, legal)
        expected = wins or threats or legal
        kinds.add("win" if wins else "block" if threats else "free")
        assert pick in expected
    assert kinds == {"win", "block", "free"}  # the positions exercise every rule


def test_tictactoe_action_numbering_matches_observation_grid():
    # Action a lands on observation cell (a // 3, a % 3).
    for action in range(9):
        env, _, _ = play("tictactoe", [action])
        opponent_view = env.observe(env.agent_selection)["observation"]
        expected = np.zeros((3, 3), dtype=np.int8)
        expected[divmod(action, 3)] = 1
        np.testing.assert_array_equal(opponent_view[..., 1], expected)
        np.testing.assert_array_equal(
            TICTACTOE.play(np.zeros((3, 3), np.int8), action, OPPONENT), -expected
        )


def test_tictactoe_takes_win_over_block():
    # X at 0, 1 wins at 2; O at 3, 4 threatens 5.
    moves = [0, 3, 1, 4]
    assert mover_wins_with("tictactoe", moves, 2)
    assert tactical_choices("tictactoe", moves) == {2}


def test_tictactoe_blocks_win():
    # X at 0, 8; O at 4, 2 threatens 6 (anti-diagonal); X has no win.
    moves = [0, 4, 8, 2]
    assert tactical_choices("tictactoe", moves) == {6}


def test_random_bot_plays_only_and_all_legal_moves():
    _, observation, mask = play("tictactoe", [4, 0, 8])
    bot = RandomBot(seed=0)
    picks = [bot.act(observation, mask) for _ in range(600)]
    assert set(picks) == {1, 2, 3, 5, 6, 7}
    counts = np.bincount(picks, minlength=9)[[1, 2, 3, 5, 6, 7]]
    assert counts.min() > 60  # uniform would give 100 each


def test_bots_are_deterministic_given_seed():
    _, observation, mask = play("connect_four", [3, 3])
    for make in (lambda s: RandomBot(s), lambda s: TacticalBot("connect_four", s)):
        a, b = make(7), make(7)
        assert [a.act(observation, mask) for _ in range(50)] == [
            b.act(observation, mask) for _ in range(50)
        ]


def test_no_legal_move_raises():
    observation = np.zeros((6, 7, 2), np.int8)
    mask = np.zeros(7, np.int8)
    with pytest.raises(ValueError, match="no legal move"):
        RandomBot(0).act(observation, mask)
    with pytest.raises(ValueError, match="no legal move"):
        TacticalBot("connect_four", 0).act(observation, mask)


def test_make_bot_builds_requested_bot():
    assert isinstance(make_bot("random", "connect_four", 0), RandomBot)
    assert isinstance(make_bot("random", "some_other_game", 0), RandomBot)
    bot = make_bot("tactical", "tictactoe", 0)
    assert isinstance(bot, TacticalBot) and bot.game is TICTACTOE


def test_make_bot_errors_name_bad_value_and_choices():
    with pytest.raises(ValueError, match=r"'alphazero'.*'random', 'tactical', 'minimax:D'"):
        make_bot("alphazero", "connect_four")
    with pytest.raises(ValueError, match=r"'chess'.*'connect_four', 'tictactoe'"):
        make_bot("tactical", "chess")
    with pytest.raises(ValueError, match=r"'chess'.*'connect_four', 'tictactoe'"):
        TacticalBot("chess")


def play_game(first, second, seed: int, game: str = "connect_four") -> float:
    """Plays one game; returns the first player's reward. Asserts every move is legal."""
    env = ENVS[game].env()
    env.reset(seed=seed)
    players = dict(zip(env.possible_agents, (first, second)))
    for agent in env.agent_iter():
        obs, _, terminated, truncated, _ = env.last()
        if terminated or truncated:
            return env.rewards[env.possible_agents[0]]
        action = players[agent].act(obs["observation"], obs["action_mask"])
        assert obs["action_mask"][action] == 1
        env.step(action)
    raise AssertionError("game did not end")


def test_tactical_beats_random_at_connect_four():
    wins = 0
    n_games = 200
    for game in range(n_games):
        tactical = TacticalBot("connect_four", seed=game)
        random_bot = RandomBot(seed=10_000 + game)
        if game % 2 == 0:
            wins += play_game(tactical, random_bot, game) == 1
        else:
            wins += play_game(random_bot, tactical, game) == -1
    win_rate = wins / n_games
    print(f"tactical vs random win rate: {win_rate:.3f}")
    assert win_rate >= 0.85


# -- minimax ---------------------------------------------------------------------------------------

def minimax_choices(game: str, moves: list[int], depth: int) -> set[int]:
    """Actions minimax:depth picks in the position after ``moves``, over many seeds."""
    _, observation, mask = play(game, moves)
    return {MinimaxBot(game, depth, seed).act(observation, mask) for seed in SEEDS}


def wins_by_force_in_three(game: str, moves: list[int], action: int) -> bool:
    """True if, after the mover plays ``action``, every reply leaves the mover an immediate win."""
    env, _, _ = play(game, moves + [action])
    if all(env.terminations.values()):
        return False
    replies = np.flatnonzero(env.last()[0]["action_mask"])
    for reply in replies:
        env2, _, _ = play(game, moves + [action, int(reply)])
        legal = np.flatnonzero(env2.last()[0]["action_mask"])
        if not any(mover_wins_with(game, moves + [action, int(reply)], int(m)) for m in legal):
            return False
    return True


def test_connect_four_windows_and_leaf_evaluation():
    assert CONNECT_FOUR.windows.shape == (69, 4) and TICTACTOE.windows.shape == (8, 3)
    bot = MinimaxBot("connect_four", 2, 0)
    board = np.zeros((6, 7), np.int8)
    assert bot.evaluate(board) == 0
    board[5, 0:3] = TO_MOVE
    # Bottom-row windows starting at col 0 (open three, +5) and col 1 (open two, +2); every
    # other window holds at most one piece.
    assert bot.evaluate(board) == 7
    assert bot.evaluate(-board) == -7  # the same position seen by the other player
    board[5, 3] = OPPONENT  # closes both windows; the opponent's piece is alone in its windows...
    assert bot.evaluate(board) == -bots.CENTRE_WEIGHT  # ...but holds the centre column
    board[4, 3] = TO_MOVE  # the centre column is even again; (4,3) and (5,2) make an anti-diagonal open two
    assert bot.evaluate(board) == 2


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_connect_four_minimax_opens_in_the_centre_column(depth):
    # On the empty board no line holds two pieces within 4 plies: only the centre term tells moves apart.
    assert minimax_choices("connect_four", [], depth) == {3}


def test_the_centre_term_sets_the_values_of_both_searches():
    # Depth 2 on the empty board: after 3 the best reply stacks on 3 (centre even, 0); after any other
    # column the reply takes the centre (-3). Without the centre term every move would be worth 0.
    empty = [[0] * 7 for _ in range(6)]
    bot = MinimaxBot("connect_four", 2, 0)
    expected = [-bots.CENTRE_WEIGHT] * 7
    expected[3] = 0
    assert bot.move_values(np.zeros((1, 42), np.int8))[0].tolist() == expected
    assert bot.scores(empty, list(range(7))) == {3: 0}
    # Depth 1: each move is valued by the position it leaves, where only a centre piece scores.
    one_ply = MinimaxBot("connect_four", 1, 0)
    assert one_ply.move_values(np.zeros((1, 42), np.int8))[0].tolist() == [0, 0, 0, bots.CENTRE_WEIGHT, 0, 0, 0]
    assert one_ply.scores(empty, list(range(7))) == {3: bots.CENTRE_WEIGHT}


def test_tictactoe_minimax_prefers_the_centre_by_its_lines_alone():
    # No centre term in tic-tac-toe: the centre lies on 4 lines (+2 each with one piece), a corner on 3.
    bot = MinimaxBot("tictactoe", 1, 0)
    assert bot.scores([[0] * 3 for _ in range(3)], list(range(9))) == {4: 8}
    assert minimax_choices("tictactoe", [], 1) == {4}


@pytest.mark.parametrize("depth", [1, 2, 4])
@pytest.mark.parametrize("moves, winning_move", [(C4_HORIZONTAL, 3), (C4_VERTICAL, 0), (C4_DIAGONAL, 3)],
                         ids=["horizontal", "vertical", "diagonal"])
def test_minimax_takes_immediate_win(moves, winning_move, depth):
    assert minimax_choices("connect_four", moves, depth) == {winning_move}


@pytest.mark.parametrize("depth", [2, 3])
def test_minimax_blocks_opponent_win(depth):
    assert minimax_choices("connect_four", [0, 1, 0, 2, 6, 3], depth) == {4}


def test_minimax_prefers_the_sooner_win():
    # Player 1: (5,1) (5,2) and (5,6) (4,6) (3,6); player 2: (4,1) (4,2) (3,1) (3,2) (5,5).
    moves = [1, 1, 2, 2, 6, 1, 6, 2, 6, 5]
    assert mover_wins_with("connect_four", moves, 6)  # now, vertically
    later = [0, 3, 4]  # each adds a row-5 threat to the col-6 one: a win two plies later
    assert all(wins_by_force_in_three("connect_four", moves, m) for m in later)
    assert minimax_choices("connect_four", moves, 4) == {6}
    _, observation, mask = play("connect_four", moves)
    board = CONNECT_FOUR.board_from_observation(observation)
    assert MinimaxBot("connect_four", 4, 0).scores(board, later) == {m: WIN_SCORE - 3 for m in later}


def test_minimax_values_a_forced_loss_by_when_it_comes():
    # Player 2 holds (5,1) (5,2) (5,3) with both ends open; player 1 can block only one end.
    moves = [6, 1, 6, 2, 5, 3]
    _, observation, mask = play("connect_four", moves)
    board = CONNECT_FOUR.board_from_observation(observation)
    legal = CONNECT_FOUR.legal_moves(board)
    assert MinimaxBot("connect_four", 4, 0).scores(board, legal) == {m: -(WIN_SCORE - 2) for m in legal}


def test_minimax_breaks_ties_at_random_and_is_deterministic_given_seed():
    # The empty tic-tac-toe board: every first move draws under perfect play.
    _, observation, mask = play("tictactoe", [])
    picks = {MinimaxBot("tictactoe", 9, seed).act(observation, mask) for seed in range(40)}
    assert picks == set(range(9))
    a, b = MinimaxBot("connect_four", 3, 5), MinimaxBot("connect_four", 3, 5)
    _, observation, mask = play("connect_four", [3, 3])
    assert [a.act(observation, mask) for _ in range(20)] == [b.act(observation, mask) for _ in range(20)]


@pytest.mark.parametrize("game", ["connect_four", "tictactoe"])
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_batched_full_width_search_finds_the_alpha_beta_best_moves_and_values(game, depth):
    observations, masks = random_positions(game, 300, seed=depth)
    bot, g = MinimaxBot(game, depth, 0), bots.GAMES[game]
    values = bot.move_values(g.boards_from_observations(observations))
    assert depth <= bots.FULL_WIDTH_MAX_DEPTH  # act_batch searches these depths this way
    decided = 0
    for observation, mask, row in zip(observations, masks, values):
        alpha_beta = bot.scores(g.board_from_observation(observation), np.flatnonzero(mask).tolist())
        best = row.max()
        assert np.flatnonzero(row == best).tolist() == sorted(alpha_beta)
        assert set(alpha_beta.values()) == {best}
        decided += abs(best) >= WIN_SCORE - depth
    assert decided > 0  # some positions hold a forced win or loss within the horizon


def test_minimax_batch_answers_every_position_with_a_legal_best_move():
    observations, masks = random_positions("connect_four", 64)
    bot = MinimaxBot("connect_four", 2, 0)
    picks = bot.act_batch(observations, masks)
    values = bot.move_values(CONNECT_FOUR.boards_from_observations(observations))
    assert picks.shape == (64,) and all(masks[n, a] == 1 for n, a in enumerate(picks))
    assert all(values[n, a] == values[n].max() for n, a in enumerate(picks))
    with pytest.raises(ValueError, match="no legal move"):
        bot.act_batch(observations[:2], np.zeros_like(masks[:2]))


def test_tictactoe_minimax_9_is_perfect_play():
    _, observation, mask = play("tictactoe", [4])  # X took the centre: only corners hold the draw
    assert minimax_choices("tictactoe", [4], 9) == {0, 2, 6, 8}
    for opponent in ("random", "tactical"):
        for game in range(40):
            perfect, other = make_bot("minimax:9", "tictactoe", game), make_bot(opponent, "tictactoe", 500 + game)
            assert play_game(perfect, other, game, "tictactoe") >= 0, (opponent, game)
            assert play_game(other, perfect, game, "tictactoe") <= 0, (opponent, game)
    for game in range(20):
        a, b = make_bot("minimax:9", "tictactoe", game), make_bot("minimax:9", "tictactoe", 100 + game)
        assert play_game(a, b, game, "tictactoe") == 0


def test_connect_four_minimax_2_beats_tactical():
    n_games = 40
    for seat in (0, 1):
        wins = 0
        for game in range(n_games):
            minimax, tactical = MinimaxBot("connect_four", 2, game), TacticalBot("connect_four", 1000 + game)
            if seat == 0:
                wins += play_game(minimax, tactical, game) == 1
            else:
                wins += play_game(tactical, minimax, game) == -1
        print(f"minimax:2 vs tactical, minimax in seat {seat}: won {wins / n_games:.1%}")
        assert wins / n_games >= 0.9


class TimedBot:
    """Wraps a bot and adds up the seconds its ``act`` calls take."""

    def __init__(self, bot):
        self.bot, self.seconds = bot, 0.0

    def act(self, observation, action_mask):
        start = time.perf_counter()
        action = self.bot.act(observation, action_mask)
        self.seconds += time.perf_counter() - start
        return action


def test_connect_four_minimax_2_plays_a_game_well_under_a_second():
    bots._best_moves_cache.clear()  # time the search, not cache look-ups
    slowest = 0.0
    for game in range(5):
        a, b = TimedBot(MinimaxBot("connect_four", 2, game)), TimedBot(MinimaxBot("connect_four", 2, 50 + game))
        play_game(a, b, game)
        slowest = max(slowest, a.seconds, b.seconds)
    print(f"minimax:2, slowest side of 5 connect-four games: {slowest * 1000:.1f} ms")
    assert slowest < 0.25


@pytest.mark.parametrize("spec, env_name, message", [
    ("minimax", "connect_four", r"'minimax' needs a search depth, as in 'minimax:2'"),
    ("minimax:", "connect_four", r"'minimax:': the depth must be an integer"),
    ("minimax:x", "tictactoe", r"'minimax:x': the depth must be an integer.*1..9 for tictactoe"),
    ("minimax:0", "connect_four", r"'minimax:0': depth 0 is out of range for connect_four; choose 1..8"),
    ("minimax:9", "connect_four", r"'minimax:9': depth 9 is out of range for connect_four; choose 1..8"),
    ("minimax:10", "tictactoe", r"depth 10 is out of range for tictactoe; choose 1..9"),
    ("minimax:2", "chess", r"'minimax:2' does not support env 'chess'"),
])
def test_bad_minimax_specs_raise_clear_errors(spec, env_name, message):
    with pytest.raises(ValueError, match=message):
        make_bot(spec, env_name)
