"""atari2p:<game>: PettingZoo's multi-player Atari games, every player preprocessed as atari:<Game> is."""

from __future__ import annotations

import os
import time

import gymnasium
import numpy as np
import pytest
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

from impala_league.envs import atari2p
from impala_league.envs.registry import env_spec, make_env

pytest.importorskip("multi_agent_ale_py")


def test_spec_two_seats_frames_and_the_players_planes():
    spec = env_spec("atari2p:boxing")
    assert spec.kind == "parallel" and spec.version == "boxing_v2"
    assert spec.agents == ("first_0", "second_0") and spec.seats == ("first", "second")
    assert spec.agent_seats == (0, 1)
    assert spec.obs_shape == (4 + 2, 84, 84) and spec.obs_dtype == np.uint8 and spec.obs_image
    assert spec.frames_per_step == 4 and spec.num_actions == 18  # boxing's minimal set is all 18
    assert env_spec("atari2p:pong").num_actions == 6
    plain = env_spec("atari2p:boxing", {"agent_indicator": False, "frame_stack": 2, "frame_skip": 3, "screen_size": 42})
    assert plain.obs_shape == (2, 42, 42) and plain.frames_per_step == 3 and plain.obs_image
    four = env_spec("atari2p:pong", {"num_players": 4, "full_action_space": True})  # pong's own option passes
    assert four.seats == ("first", "second", "third", "fourth") and four.obs_shape == (8, 84, 84)
    assert four.num_actions == 18


def test_adapter_steps_observations_settlements_and_the_indicator():
    env = make_env("atari2p:boxing", 5)
    rng = np.random.default_rng(0)
    step = env.advance()
    for _ in range(6):
        assert step.agents == [0, 1]
        for agent, obs in zip(step.agents, step.observations):
            assert obs.shape == (6, 84, 84) and obs.dtype == np.uint8
            assert (obs[4 + agent] == 255).all() and (obs[5 - agent] == 0).all()  # its own plane lit
        np.testing.assert_array_equal(step.observations[0][:4], step.observations[1][:4])  # one screen
        assert step.observations[0][:4].max() > 0  # the ring is drawn
        assert all(mask.shape == (18,) and mask.all() for mask in step.action_masks)
        env.act(rng.integers(0, 18, 2).tolist())
        step = env.advance()
        assert sorted(s.agent for s in step.settlements) == [0, 1]
        assert all(not s.done and np.isfinite(s.reward) for s in step.settlements)


def test_time_limit_is_a_truncation_for_both_and_the_higher_return_wins():
    env = make_env("atari2p:boxing", 1, {"max_cycles": 50, "noop_max": 0})
    step, length = env.advance(), 0
    while not step.episodes:
        env.act([1, 0])  # first player punches (FIRE), second stands
        step = env.advance()
        length += 1
    assert length == 13  # frames 1..50 in steps of 4: the 13th step stops at frame 50
    (result,) = step.episodes
    assert result.length == 13 and len(result.returns) == 2
    assert result.winner == (None if result.returns[0] == result.returns[1] else int(np.argmax(result.returns)))
    assert sorted(s.agent for s in step.settlements) == [0, 1]
    for s in step.settlements:
        assert s.done and s.truncated and s.final_observation.shape == (6, 84, 84)
    assert step.agents == [0, 1]  # the next game is under way


def test_a_cut_inside_the_frame_skip_ends_on_the_screen_after_its_last_frame():
    """max_cycles 50: the 13th step is cut 2 frames in. Its final observation's newest frame is the
    screen those 2 frames end on in the same game played without a limit (not the 12th step's, which
    a skip left before reading the screen would repeat); the older frames are that game's."""
    import cv2

    rng = np.random.default_rng(4)
    actions = [dict(zip(("first_0", "second_0"), rng.integers(0, 18, 2).tolist())) for _ in range(13)]
    cut = atari2p.make_atari2p("boxing", {"max_cycles": 50, "noop_max": 0, "agent_indicator": False})
    cut.reset(seed=3)
    for t, action in enumerate(actions):
        obs, _, _, truncated, _ = cut.step(action)
    assert all(truncated.values()) and cut.agents == []
    uncut = atari2p.make_atari2p("boxing", {"noop_max": 0, "agent_indicator": False})
    uncut.reset(seed=3)
    for action in actions[:12]:
        stack = uncut.step(action)[0]["first_0"]
    for _ in range(2):
        uncut.raw.step(actions[12])
    newest = cv2.resize(uncut.raw.ale.getScreenGrayscale(), (84, 84), interpolation=cv2.INTER_AREA)
    for agent in ("first_0", "second_0"):
        np.testing.assert_array_equal(obs[agent][-1], newest)
        np.testing.assert_array_equal(obs[agent][:-1], stack[1:])
    assert not np.array_equal(newest, stack[-1])  # the screen moved: a stale frame would be caught


def test_unknown_game_names_the_closest_and_unknown_kwargs_are_refused():
    with pytest.raises(ValueError, match="atari2p:boxing"):
        env_spec("atari2p:boxng")
    with pytest.raises(ValueError, match=r"does not take env.kwargs \['frameskip'\].*frame_skip"):
        env_spec("atari2p:boxing", {"frameskip": 4})
    with pytest.raises(ValueError, match="game_version"):  # pong's own options are named
        env_spec("atari2p:pong", {"mode": 1})
    with pytest.raises(ValueError, match="noop_max"):
        env_spec("atari2p:boxing", {"noop_max": -1})


class _OnePlayer(gymnasium.Env):
    """PettingZoo's raw Atari env seen by gymnasium's AtariPreprocessing: an action is both players'."""

    def __init__(self, raw):
        self.raw, self.ale, self._frameskip = raw, raw.ale, 1
        self.observation_space = gymnasium.spaces.Box(0, 255, (210, 160), np.uint8)
        self.action_space = gymnasium.spaces.MultiDiscrete([18, 18])

    @property
    def np_random(self):
        return self.raw.np_random

    def get_action_meanings(self):
        return ["NOOP"]

    def reset(self, *, seed=None, options=None):
        self.raw.reset(seed=seed)
        return self.ale.getScreenGrayscale()[:, :, 0], {}

    def step(self, action):
        both = (action, action) if np.isscalar(action) else action
        _, rewards, terminated, truncated, _ = self.raw.step(dict(zip(self.raw.possible_agents, map(int, both))))
        return (self.ale.getScreenGrayscale()[:, :, 0], rewards["first_0"], any(terminated.values()),
                any(truncated.values()), {})


def test_frames_equal_gymnasium_atari_preprocessing_and_frame_stack():
    ours = atari2p.make_atari2p("boxing", {})
    import ale_py.roms  # the ROM is the ale-py wheel's: nothing is downloaded

    assert ours.raw.rom_path == os.path.join(os.path.dirname(ale_py.roms.__file__), "boxing.bin")
    reference = FrameStackObservation(AtariPreprocessing(_OnePlayer(atari2p.make_atari2p("boxing", {}).raw),
                                                         noop_max=30, frame_skip=4, screen_size=84), 4)
    obs, _ = ours.reset(seed=11)
    expected, _ = reference.reset(seed=11)
    assert ours.raw.frame == reference.unwrapped.raw.frame > 0  # the same number of no-op frames
    rng = np.random.default_rng(1)
    total, expected_total = 0.0, 0.0
    for t in range(40):
        np.testing.assert_array_equal(obs["first_0"][:4], expected, err_msg=f"step {t}")
        np.testing.assert_array_equal(obs["second_0"][:4], expected)
        actions = rng.integers(0, 18, 2)
        obs, rewards, _, _, _ = ours.step(dict(zip(ours.agents, actions.tolist())))
        expected, reward, _, _, _ = reference.step(actions)
        total, expected_total = total + rewards["first_0"], expected_total + reward
    assert total == expected_total


def _play(env, actions):
    """Observations of `first_0` and both rewards over `actions` (pairs)."""
    out = []
    for pair in actions:
        obs, rewards, _, _, _ = env.step(dict(zip(env.agents, pair)))
        out.append((obs["first_0"], rewards["first_0"], rewards["second_0"]))
    return out


def test_a_seeded_reset_after_a_game_starts_the_game_a_fresh_env_starts():
    rng = np.random.default_rng(2)
    played = atari2p.make_atari2p("boxing", {})
    played.reset(seed=3)
    _play(played, rng.integers(0, 18, (30, 2)).tolist())
    fresh = atari2p.make_atari2p("boxing", {})
    first, again = fresh.reset(seed=11)[0], played.reset(seed=11)[0]
    np.testing.assert_array_equal(first["second_0"], again["second_0"])
    assert fresh.raw.frame == played.raw.frame > 0
    actions = rng.integers(0, 18, (40, 2)).tolist()
    for (a, ra, sa), (b, rb, sb) in zip(_play(fresh, actions), _play(played, actions)):
        np.testing.assert_array_equal(a, b)
        assert (ra, sa) == (rb, sb)


def test_sticky_actions_reach_the_emulator():
    # With probability 0.999 the ALE repeats the previous action at each frame (NOOP from the reset), and
    # in these 48 frames of seed 2 it always does (seed 0 made the ALE seed from the clock, so it only
    # mostly did): what the players ask for changes nothing.
    runs = []
    env = atari2p.make_atari2p("boxing", {"sticky_actions": 0.999, "noop_max": 0})
    for actions in ([[1, 1]] * 12, [[3, 4]] * 12):
        env.reset(seed=2)
        runs.append([obs for obs, _, _ in _play(env, actions)])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    moving = atari2p.make_atari2p("boxing", {"noop_max": 0, "sticky_actions": 0.0})
    moving.reset(seed=0)
    assert not np.array_equal(_play(moving, [[3, 4]] * 12)[-1][0], runs[1][-1])


def test_mirrored_players_see_the_frames_flipped_and_their_own_plane():
    """Pong is the same game seen from either side: its left paddle (columns 16-19 of the 160) flipped
    lies on the right one's (140-143), so with `mirrored_players: [second_0]` both players see
    themselves where the one-player game's player is."""
    env = atari2p.make_atari2p("pong", {"mirrored_players": ["second_0"]})
    plain = atari2p.make_atari2p("pong", {})
    obs, _ = env.reset(seed=3)
    reference, _ = plain.reset(seed=3)
    rng = np.random.default_rng(0)
    for t in range(30):
        np.testing.assert_array_equal(obs["first_0"], reference["first_0"], err_msg=f"step {t}")
        np.testing.assert_array_equal(obs["second_0"][:4], reference["second_0"][:4, :, ::-1], err_msg=f"step {t}")
        np.testing.assert_array_equal(obs["second_0"][4:], reference["second_0"][4:], err_msg=f"step {t}")
        actions = {agent: int(rng.integers(6)) for agent in env.agents}
        obs = env.step(actions)[0]
        reference = plain.step(actions)[0]
    screen = np.zeros((210, 160), np.uint8)
    env.raw.ale.getScreenGrayscale(screen)
    assert set(np.flatnonzero((screen[34:194] == 148).any(0))) == {16, 17, 18, 19}  # the left paddle
    assert set(159 - np.flatnonzero((screen[34:194] == 147).any(0))) == {16, 17, 18, 19}  # the right one, flipped
    for _ in range(25):  # action 2 (RIGHT) moves both paddles up: the actions need no flip
        env.step({"first_0": 2, "second_0": 2})
    env.raw.ale.getScreenGrayscale(screen)
    assert np.flatnonzero((screen[34:194] == 147).any(1)).max() < 10 and \
        np.flatnonzero((screen[34:194] == 148).any(1)).max() < 10
    bare = atari2p.make_atari2p("pong", {"mirrored_players": ["first_0"], "agent_indicator": False})
    first = bare.reset(seed=3)[0]["first_0"]
    assert first.shape == (4, 84, 84) and first.flags.c_contiguous
    with pytest.raises(ValueError, match="mirrored_players: pong_v3 has no player third_0; its players: first_0, "
                                         "second_0"):
        atari2p.make_atari2p("pong", {"mirrored_players": ["third_0"]})
    with pytest.raises(ValueError, match=r"mirrored_players must be a list of player names \(e.g. \[second_0\]\)"):
        atari2p.settings("pong", {"mirrored_players": "second_0"})


def test_seed_0_replays_the_same_sticky_game_a_second_later():
    # The ALE seeds sticky actions from the clock at random_seed 0: two games a second apart differed.
    assert [atari2p.ale_seed(s) for s in (0, 11, 2**31 - 1, 2**40)] == [1, 11, 2**31 - 1, 2**40 % (2**31 - 1) + 1]

    def play() -> list[np.ndarray]:
        env = make_env("atari2p:boxing", 0, {"noop_max": 0})
        step, rng, frames = env.advance(), np.random.default_rng(1), []
        for _ in range(12):
            env.act(rng.integers(0, 18, len(step.agents)).tolist())
            step = env.advance()
            frames.append(step.observations[0].copy())
        return frames

    first = play()
    time.sleep(1.1)
    assert all(np.array_equal(a, b) for a, b in zip(first, play()))
