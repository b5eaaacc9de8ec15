"""Memory tasks: the built-in `cue_recall`, POPGym's envs through `popgym:<Env>` and `gym:popgym-...`."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from impala_league.envs.memory import CueRecall
from impala_league.envs.registry import env_spec, make_env
from impala_league.envs.spaces import observation_encoder


def play(env, policy, episodes: int):
    """Drive an adapter for `episodes` episodes: per episode, the observations seen, the rewards
    settled, the actions taken, and the episode's result."""
    played, obs, rewards, actions = [], [], [], []
    while len(played) < episodes:
        step = env.advance()
        rewards += [s.reward for s in step.settlements]
        for result in step.episodes:
            n = result.length  # the episode's steps are the first n of the lists (play went on)
            played.append((np.array(obs[:n]), rewards[:n], actions[:n], result))
            obs, rewards, actions = obs[n:], rewards[n:], actions[n:]
        obs.append(step.observations[0])
        actions.append(policy(step.observations[0], len(obs) - 1))
        env.act([actions[-1]])
    return played


def cue_of(observations: np.ndarray) -> int:
    return int(np.argmax(observations[0][:-1]))


def test_cue_recall_shows_the_cue_first_and_the_query_last():
    env = make_env("cue_recall", 5, {"num_cues": 3, "delay_min": 2, "delay_max": 6})
    rng = np.random.default_rng(0)
    episodes = play(env, lambda obs, t: int(rng.integers(3)), 40)
    delays = set()
    for obs, rewards, actions, result in episodes:
        delay = len(obs) - 2
        delays.add(delay)
        assert 2 <= delay <= 6 and result.length == delay + 2
        assert obs.dtype == np.float32 and obs.shape == (delay + 2, 4)
        assert obs[0].sum() == 1 and obs[0][3] == 0  # step 0: one cue, no query flag
        assert not obs[1:-1].any()  # blank steps
        np.testing.assert_array_equal(obs[-1], [0, 0, 0, 1])  # the query, cue slots empty
        expected = 1.0 if actions[-1] == cue_of(obs) else 0.0
        assert rewards == [0.0] * (delay + 1) + [expected] and result.returns == (expected,)
    assert delays == {2, 3, 4, 5, 6}  # every delay in the bounds is drawn
    assert {cue_of(obs) for obs, *_ in episodes} == {0, 1, 2}


def test_cue_recall_rewards_exactly_the_right_answer_and_terminates():
    env = CueRecall(num_cues=4, delay_min=1, delay_max=1)
    for answer in range(4):
        obs, _ = env.reset(seed=11)
        cue = int(np.argmax(obs[:4]))
        for action in (3 - cue, cue):  # actions before the query are ignored
            assert env.step(action)[1:4] == (0.0, False, False)
        _, reward, terminated, truncated, info = env.step(answer)
        assert reward == (1.0 if answer == cue else 0.0) and terminated and not truncated and info == {"cue": cue}
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)
    spec = env_spec("cue_recall")  # defaults: 2 cues, delays 8..24
    assert spec.obs_shape == (3,) and spec.obs_dtype == np.float32 and spec.num_actions == 2 and spec.kind == "gym"
    with pytest.raises(ValueError, match="delay_min <= delay_max"):
        env_spec("cue_recall", {"delay_min": 5, "delay_max": 4})
    with pytest.raises(ValueError, match="does not accept env.kwargs"):
        env_spec("cue_recall", {"cues": 3})


def test_cue_recall_replays_its_episodes_from_the_seed():
    def episodes(seed):
        return [(obs.tolist(), result.length) for obs, _, _, result in
                play(make_env("cue_recall", seed), lambda obs, t: 0, 6)]
    first = episodes(np.random.SeedSequence(7, spawn_key=(0, 1)))
    assert first == episodes(np.random.SeedSequence(7, spawn_key=(0, 1)))
    assert first != episodes(np.random.SeedSequence(7, spawn_key=(0, 2)))
    assert episodes(3) == episodes(3)
    # A policy that remembers the cue answers every query right; one that always answers 0 is right
    # exactly when the cue is 0.
    memory = {}

    def remember(obs, t):
        if t == 0:
            memory["cue"] = int(np.argmax(obs[:2]))
        return memory["cue"]
    results = [result.returns for *_, result in play(make_env("cue_recall", 3), remember, 5)]
    assert results == [(1.0,)] * 5


def test_popgym_prefix_builds_repeat_previous_with_one_hot_cards():
    spec = env_spec("popgym:RepeatPreviousEasy")
    assert spec.kind == "gym" and spec.num_actions == 4 and spec.obs_shape == (4,)  # Discrete(4) suits, one-hot
    assert spec.version == "popgym-RepeatPreviousEasy-v0"
    assert env_spec("gym:popgym-RepeatPreviousEasy-v0").obs_shape == (4,)
    # Naming the suit of the card 4 back (k=4) scores +1/48, a wrong suit -1/48, on the 48 steps that have one.
    (obs, rewards, actions, result), = play(make_env("popgym:RepeatPreviousEasy", 2),
                                            lambda obs, t: 0, 1)
    suits = obs.argmax(axis=1)
    assert result.length == 51 and obs.sum(axis=1).tolist() == [1] * 51
    expected = [0.0] * 3 + [(1 if suits[t - 3] == 0 else -1) / 48 for t in range(3, 51)]
    np.testing.assert_allclose(rewards, expected)


def test_popgym_position_only_cartpole_is_truncated_at_200_steps():
    env = make_env("popgym:PositionOnlyCartPoleEasy", 1)
    assert env_spec("popgym:PositionOnlyCartPoleEasy").obs_shape == (2,)
    state = env.env.env.unwrapped  # the hidden state, for a controller that balances the pole
    for _ in range(200):
        step = env.advance()
        assert not step.episodes
        x, x_dot, theta, theta_dot = state.state
        env.act([int(theta + 0.5 * theta_dot + 0.01 * x + 0.05 * x_dot > 0)])
    step = env.advance()
    (settled,) = step.settlements
    assert settled.done and settled.truncated and settled.final_observation.shape == (2,)
    assert settled.reward == pytest.approx(1 / 200) and step.episodes[0].returns[0] == pytest.approx(1.0)


def test_unknown_popgym_names_name_the_closest():
    with pytest.raises(ValueError, match="did you mean 'popgym:RepeatPreviousEasy'"):
        env_spec("popgym:RepeatPrevEasy")
    with pytest.raises(ValueError, match="did you mean 'popgym:PositionOnlyCartPoleEasy'"):
        env_spec("popgym:positiononlycartpoleeasy")
    with pytest.raises(ValueError, match="did you mean 'gym:popgym-RepeatPreviousEasy-v0'"):
        env_spec("gym:popgym-RepeatPrevEasy-v0")


def test_discrete_observation_is_its_one_hot():
    encoder = observation_encoder(spaces.Discrete(5))
    assert encoder.shape == (5,)
    for x in range(5):
        np.testing.assert_array_equal(encoder.encode(x)[0], np.eye(5)[x])
        np.testing.assert_array_equal(encoder.encode(np.int64(x))[0], np.eye(5)[x])
