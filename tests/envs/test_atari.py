"""`atari:<Game>` on the gymnasium path (envs/atari.py): a time limit that cuts an episode inside the
frame skip ends it on the true screen, checked against the same seeded actions played without a limit.
A few hundred emulator frames per case: about a second each."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from impala_league.envs import atari

ACTIONS = np.random.default_rng(2).integers(6, size=101).tolist()


def _without_limit(played: int) -> tuple[np.ndarray, np.ndarray]:
    """The same game without a time limit: the frame stack after ACTIONS[:100], and the frame that the
    101st step's first `played` frames end on (the max over its last two when it plays all 4)."""
    env = atari.make_atari("Pong", {"noop_max": 0})
    env.reset(seed=7)
    for action in ACTIONS[:100]:
        stack = env.step(action)[0]
    ale = env.unwrapped.ale
    screens = []
    for _ in range(played):
        ale.act(env.unwrapped._action_set[ACTIONS[100]])
        screens.append(ale.getScreenGrayscale())
    screen = np.maximum(screens[-2], screens[-1]) if played == 4 else screens[-1]
    return stack, cv2.resize(screen, (84, 84), interpolation=cv2.INTER_AREA)


@pytest.mark.parametrize("played", [1, 2, 3, 4])
def test_a_cut_inside_the_frame_skip_ends_on_the_screen_after_its_last_frame(played):
    """A limit of 400 + played frames cuts the 101st step after `played` of its 4 frames. gymnasium's
    own AtariPreprocessing leaves the skip before it reads the screen: its newest frame would repeat
    the 100th step's (and with played = 4 pool a stale buffer)."""
    env = atari.make_atari("Pong", {"noop_max": 0, "max_episode_frames": 400 + played})
    env.reset(seed=7)
    for t, action in enumerate(ACTIONS):
        obs, _, terminated, truncated, _ = env.step(action)
        if truncated:
            break
    assert t == 100 and truncated and not terminated
    stack, newest = _without_limit(played)
    np.testing.assert_array_equal(obs[-1], newest)
    np.testing.assert_array_equal(obs[:-1], stack[1:])  # the older frames are the uncut game's
