"""envs/atari2p_vector.py: an actor's atari2p:<game> games stepped by one group play every game as one
`ParallelAdapter` over `Preprocessed` per slot does (`make_env`), step for step."""

from __future__ import annotations

import numpy as np
import pytest

from impala_league.distributed.actor import stacked
from impala_league.envs.atari2p_vector import Atari2pGroup, resize_frames, tall_resize_exact
from impala_league.envs.base import Step
from impala_league.envs.registry import env_spec, make_env

pytest.importorskip("multi_agent_ale_py")


def assert_same_step(ours: Step, reference: Step, where: str) -> None:
    """Every field of two steps equal: acting agents, observations, masks, settlements, episodes."""
    assert ours.agents == reference.agents, where
    for a, b in zip(ours.observations, reference.observations):
        assert a.dtype == b.dtype == np.uint8, where
        np.testing.assert_array_equal(a, b, err_msg=where)
    for a, b in zip(ours.action_masks, reference.action_masks):
        np.testing.assert_array_equal(a, b, err_msg=where)
    assert len(ours.settlements) == len(reference.settlements), where
    for a, b in zip(ours.settlements, reference.settlements):
        assert (a.agent, a.reward, a.done, a.truncated) == (b.agent, b.reward, b.done, b.truncated), where
        if b.final_observation is None:
            assert a.final_observation is None, where
        else:
            np.testing.assert_array_equal(a.final_observation, b.final_observation, err_msg=where)
    assert ours.episodes == reference.episodes, where


def play_both(game: str, seeds: list, kwargs: dict, steps: int, action_seed: int = 0,
              until_episodes: int = 0, seats: list | None = None) -> tuple[int, list]:
    """Play the group and one `make_env` adapter per seed on the same random actions, comparing every
    step; returns (steps played, the episodes that finished). With `until_episodes`, play until that
    many episodes have finished, at most `steps` steps. `seats`: the config's env.seats."""
    name = f"atari2p:{game}"
    spec = env_spec(name, kwargs, seats)
    group = Atari2pGroup(game, seeds, kwargs, spec.agent_seats, name)
    references = [make_env(name, seed, kwargs, seats=seats) for seed in seeds]
    rng = np.random.default_rng(action_seed)
    ours, theirs = [s.advance() for s in group.slots], [r.advance() for r in references]
    episodes = []
    for t in range(steps):
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_same_step(a, b, f"{name} {kwargs} step {t} slot {i}")
            episodes += a.episodes
        if until_episodes and len(episodes) >= until_episodes:
            break
        actions = [rng.integers(0, spec.num_actions, len(step.agents)).tolist() for step in ours]
        for slot, reference, action in zip(group.slots, references, actions):
            slot.act(action)
            reference.act(action)
        ours, theirs = [s.advance() for s in group.slots], [r.advance() for r in references]
    group.close()
    return t, episodes


def test_the_group_plays_every_game_as_one_adapter_per_slot_does():
    played, _ = play_both("boxing", [3, 4, np.random.SeedSequence(5, spawn_key=(1,))], {}, 150)
    assert played == 149


def test_time_limits_no_op_starts_and_resets_match_over_several_episodes():
    _, episodes = play_both("boxing", [0, 1, 2], {"max_cycles": 57}, 60, action_seed=1)
    assert len(episodes) >= 6  # every game cut and reset at least twice, each with its no-op start


def test_other_settings_and_sticky_actions_match():
    play_both("pong", [7, 8], {"frame_skip": 3, "frame_stack": 2, "screen_size": 42, "agent_indicator": False,
                               "max_cycles": 70, "sticky_actions": 0.25}, 60, action_seed=2)
    play_both("boxing", [9], {"frame_skip": 1, "frame_stack": 1, "noop_max": 0, "max_cycles": 30}, 40)


def test_mirrored_players_match():
    play_both("pong", [4, 5], {"mirrored_players": ["second_0"], "max_cycles": 100}, 40, action_seed=4)


def test_four_players_in_two_teams_match():
    _, episodes = play_both("pong", [1, 2], {"num_players": 4, "max_cycles": 200}, 80, action_seed=3,
                            seats=[["first_0", "third_0"], ["second_0", "fourth_0"]])
    assert episodes and all(len(e.returns) == 2 for e in episodes)  # a team's return: its two players' sum


def test_a_game_that_ends_settles_terminated_and_matches():
    """Boxing's two-minute round ends the game (`terminated`, not a time limit)."""
    played, episodes = play_both("boxing", [6], {"noop_max": 0}, 2500, until_episodes=1)
    assert len(episodes) == 1 and 1000 < played < 2500 and episodes[0].length == played


def test_observations_are_rows_of_one_array_that_the_forward_pass_reads_without_a_copy():
    group = Atari2pGroup("boxing", [0, 1, 2], {})
    for _ in range(2):
        steps = [slot.advance() for slot in group.slots]
        observations = [obs for step in steps for obs in step.observations]
        batch = stacked(observations)
        assert batch.shape == (6, 6, 84, 84) and all(np.shares_memory(batch, o) for o in observations)
        np.testing.assert_array_equal(batch, np.stack(observations))
        assert (batch[0::2, 4] == 255).all() and (batch[0::2, 5] == 0).all()  # first_0's plane lit
        assert (batch[1::2, 5] == 255).all() and (batch[1::2, 4] == 0).all()
        for slot in group.slots:
            slot.act([1, 2])
    group.close()


def test_acting_out_of_order_and_wrong_actions_are_refused():
    group = Atari2pGroup("boxing", [0, 1], {})
    steps = [slot.advance() for slot in group.slots]
    with pytest.raises(ValueError, match="takes 2 action"):
        group.slots[0].act([1])
    with pytest.raises(ValueError, match="outside 0..17"):
        group.slots[0].act([1, 18])
    group.slots[0].act([1, 2])
    with pytest.raises(RuntimeError, match="acted twice"):
        group.slots[0].act([1, 2])
    with pytest.raises(RuntimeError, match="act on every slot"):
        group.slots[0].advance()
    group.slots[1].act([0, 0])
    assert all(step.agents == [0, 1] for step in steps) and group.steps == 1
    group.close()


def test_one_tall_resize_is_each_screen_s_own():
    screens = np.random.default_rng(1).integers(0, 256, (5, 210, 160), dtype=np.uint8)
    each, together = np.empty((5, 84, 84), np.uint8), np.empty((5, 84, 84), np.uint8)
    resize_frames(screens, each, tall=False)
    resize_frames(screens, together, tall=True)
    np.testing.assert_array_equal(each, together)
    assert tall_resize_exact(16, 210, 160, 84) and not tall_resize_exact(1, 210, 160, 84)


def test_an_actor_s_envs_are_the_slots_of_one_group_with_the_declared_seats():
    from impala_league.envs.base import GroupSlot
    from impala_league.envs.registry import make_envs

    seats = [["first_0", "third_0"], ["second_0", "fourth_0"]]
    slots = make_envs("atari2p:pong", [0, 1], {"num_players": 4}, seats=seats)
    assert all(isinstance(s, GroupSlot) for s in slots) and slots[0].group is slots[1].group
    assert slots[0].group.agent_seats == (0, 1, 0, 1)
    with pytest.raises(ValueError, match="empty_mask"):
        make_envs("atari2p:boxing", [0], empty_mask="never")
    slots[0].group.close()
