"""`atari:<Game>` with `env.kwargs.emulator=ale_vector` (envs/atari_vector.py) against the gymnasium path.

The vector env's slots must give the actor what one gymnasium env per slot gives it: observations of
the spec's shape and dtype, one settlement per action, the same frames and rewards for the same
actions once the frame stack is full (no no-op starts, equal seeds), a time limit settled as truncated
with the cut state's frame stack and an EpisodeResult, play going on after it, lost lives marked as
`end_on_life_loss` marks them. A few hundred emulator steps in all: seconds.
"""

from __future__ import annotations

import numpy as np
import pytest

from impala_league.envs import atari
from impala_league.envs.atari_vector import AtariVectorGroup, ale_game, vector_seed
from impala_league.envs.registry import env_spec, make_env, make_envs

VECTOR = {"emulator": "ale_vector"}

# The two paths draw sticky actions from random numbers of their own: compared frame by frame, they play without.
DETERMINISTIC = {"sticky_actions": 0.0}


def _lockstep(game: str, kwargs: dict, actions: list[int], seed: int = 7):
    """Play `actions` in the gymnasium adapter and in slot 0 of a two-slot vector env (slot 1 plays
    action 0), both seeded `seed`; yield (t, gymnasium step, vector step) after each action."""
    reference = make_env(f"atari:{game}", seed, kwargs)
    slots = make_envs(f"atari:{game}", [seed, seed + 1], {**kwargs, **VECTOR})
    yield -1, reference.advance(), slots[0].advance()
    slots[1].advance()
    for t, action in enumerate(actions):
        reference.act([action])
        slots[0].act([action])
        slots[1].act([0])
        yield t, reference.advance(), slots[0].advance()
        slots[1].advance()


def test_rom_ids_and_seeds():
    assert ale_game("Pong") == "pong" and ale_game("MsPacman") == "ms_pacman"
    with pytest.raises(ValueError, match="atari:Pong"):
        ale_game("Pongg")
    sequence = np.random.SeedSequence(3, spawn_key=(0, 0, 0, 1))
    assert 0 <= vector_seed(sequence) < 2 ** 31 and vector_seed(5) == 5


def test_slots_steps_and_settlements():
    """Shape and dtype of the spec; every action of every slot gets exactly one settlement."""
    spec = env_spec("atari:Pong", VECTOR)
    slots = make_envs("atari:Pong", [np.random.SeedSequence(1, spawn_key=(i,)) for i in range(3)], VECTOR)
    assert len(slots) == 3 and len({id(slot.group) for slot in slots}) == 1
    rng = np.random.default_rng(0)
    steps = [slot.advance() for slot in slots]
    for _ in range(12):
        for step in steps:
            assert step.agents == [0] and len(step.observations) == 1
            obs, mask = step.observations[0], step.action_masks[0]
            assert obs.shape == spec.obs_shape and obs.dtype == spec.obs_dtype
            assert mask.dtype == np.uint8 and mask.shape == (spec.num_actions,) and mask.all()
        for slot in slots:
            slot.act([int(rng.integers(spec.num_actions))])
        steps = [slot.advance() for slot in slots]
        assert [len(step.settlements) for step in steps] == [1, 1, 1]
        assert all(s.agent == 0 and not s.done for step in steps for s in step.settlements)
    assert slots[0].group.steps == 12
    assert slots[0].advance().settlements == []  # settled once, not again


def test_acting_order_is_checked():
    slots = make_envs("atari:Pong", [1, 2], VECTOR)
    slots[0].act([1])
    with pytest.raises(RuntimeError, match="act on every slot"):
        slots[0].advance()
    with pytest.raises(RuntimeError, match="twice"):
        slots[0].act([1])
    with pytest.raises(ValueError, match="outside"):
        slots[1].act([6])
    slots[1].act([2])
    assert [len(slot.advance().settlements) for slot in slots] == [1, 1]


def test_frames_match_gymnasium_once_the_stack_is_full():
    """noop_max=0 and equal seeds: identical frames and rewards for the same actions, except the first
    frames of an episode's stack (zeros in the vector env, the reset frame repeated in gymnasium)."""
    kwargs = {"noop_max": 0, **DETERMINISTIC}
    actions = np.random.default_rng(1).integers(6, size=48).tolist()
    for t, ref, vec in _lockstep("Pong", kwargs, actions):
        a, b = ref.observations[0], vec.observations[0]
        np.testing.assert_array_equal(a[-1], b[-1])  # the newest frame, from the first step on
        if t >= 2:  # the stack holds 4 frames of the episode
            np.testing.assert_array_equal(a, b)
        else:
            assert not b[: 2 - t].any()
        assert [s.reward for s in ref.settlements] == [s.reward for s in vec.settlements]


def _unlimited_observation(actions: list[int], seed: int = 7):
    """The gymnasium path's observation after `actions` in a game without a time limit (no no-ops)."""
    env = atari.make_atari("Pong", {"noop_max": 0, **DETERMINISTIC})
    env.reset(seed=seed)
    for action in actions:
        obs = env.step(action)[0]
    return obs


@pytest.mark.parametrize("limit", [400, 402])
def test_time_limit_cuts_at_a_step_s_end_with_its_true_frames_and_play_goes_on(limit):
    """A 400-frame limit (100 steps) and a 402-frame one (cut after step 101, where the gymnasium path
    cuts 2 frames into it): the cut step settles as truncated with the frames of the same actions
    played without a limit, the episode's result is reported, the slot sits one step out (the vector
    env resets the game) and the next game goes on."""
    steps = -(-limit // 4)
    slots = make_envs("atari:Pong", [7, 8], {"noop_max": 0, "max_episode_frames": limit, **DETERMINISTIC, **VECTOR})
    actions = np.random.default_rng(2).integers(6, size=steps + 6).tolist()
    vec, other = slots[0].advance(), slots[1].advance()
    played: list[int] = []
    for t in range(len(actions)):
        if vec.agents:
            slots[0].act([actions[len(played)]])
            played.append(actions[len(played)])
        else:
            slots[0].act([])
        slots[1].act([0] * len(other.agents))  # cut at the same step (Pong goes on for 400 frames of NOOP)
        vec, other = slots[0].advance(), slots[1].advance()
        if t == steps - 1:  # the cut
            (v,) = vec.settlements
            assert v.done and v.truncated and vec.agents == []
            np.testing.assert_array_equal(v.final_observation, _unlimited_observation(played))
            (episode,) = vec.episodes
            assert episode.length == steps
        elif t == steps:  # the slot sat this step out while its game was reset
            assert vec.agents == [0] and vec.settlements == [] and not vec.episodes
            assert not vec.observations[0][:-1].any() and vec.observations[0][-1].any()  # a new game's first
        else:
            assert vec.agents == [0] and [(s.done, s.truncated) for s in vec.settlements] == [(False, False)]
    assert len(played) == len(actions) - 1 and slots[0].group.steps == len(actions)


def test_lost_lives_settle_as_done_with_end_on_life_loss():
    """Breakout, 5 lives: the same steps settle as done in both paths; the game (and its score) goes on."""
    kwargs = {"noop_max": 0, "end_on_life_loss": True, **DETERMINISTIC}
    rng = np.random.default_rng(3)
    actions = [1 if t % 10 == 0 else int(rng.integers(4)) for t in range(400)]  # FIRE launches the ball
    lost = 0
    for t, ref, vec in _lockstep("Breakout", kwargs, actions):
        if t < 0:
            continue
        (r,), (v,) = ref.settlements, vec.settlements
        assert (v.done, v.truncated, v.reward) == (r.done, r.truncated, r.reward), t
        assert len(vec.episodes) == len(ref.episodes) == 0
        lost += v.done
        if lost == 2:
            break
    assert lost == 2


def test_same_seeds_same_games():
    def frames(seeds):
        group = AtariVectorGroup("Pong", seeds, {"max_episode_frames": 200})  # a cut at step 50
        out, steps = [], [slot.advance() for slot in group.slots]
        for t in range(60):
            for slot, step in zip(group.slots, steps):
                slot.act([t % 6] * len(step.agents))
            steps = [slot.advance() for slot in group.slots]
            out.append(np.stack([step.observations[0] if step.agents else np.zeros((4, 84, 84), np.uint8)
                                 for step in steps]))
        return np.stack(out)
    a, b = frames([11, 12]), frames([12, 11])
    assert (a[:, 0] != a[:, 1]).any()  # two seeds, two games
    np.testing.assert_array_equal(a[:, 0], b[:, 1])  # a game's seed is its own, wherever its slot
    np.testing.assert_array_equal(a[:, 1], b[:, 0])


def test_settings_refuse_unknown_emulators():
    with pytest.raises(ValueError, match="emulator must be one of gymnasium, ale_vector"):
        atari.settings({"emulator": "envpool"})
    with pytest.raises(ValueError, match="emulator must be one of"):
        env_spec("atari:Pong", {"emulator": "vector"})
    with pytest.raises(ValueError, match="emulator must be one of"):
        make_envs("atari:Pong", [0], {"emulator": "vector"})
    with pytest.raises(ValueError, match="emulator_threads=2 is for emulator=ale_vector"):
        atari.settings({"emulator_threads": 2})
    with pytest.raises(ValueError, match="emulator_threads must be an integer"):
        atari.settings({"emulator": "ale_vector", "emulator_threads": 0})
    assert atari.settings({})["emulator"] == "gymnasium"


def test_other_envs_and_the_gymnasium_path_stay_independent_adapters():
    envs = make_envs("tictactoe", [0, 1])
    assert len(envs) == 2 and type(envs[0]).__name__ == "AECAdapter"
    envs = make_envs("atari:Pong", [0], {"max_episode_frames": 400})
    assert [type(e).__name__ for e in envs] == ["ParallelAdapter"]
    # make_env plays gymnasium whatever the emulator (evaluation, replays)
    assert type(make_env("atari:Pong", 0, VECTOR)).__name__ == "ParallelAdapter"


def test_the_actor_loop_plays_the_slots(tmp_path, run_name, redis_client, redis_url):
    """The real actor loop over two slots of one vector env (100-step episodes, unrolls of 20): every
    slot gives unrolls of the spec's frames, each game's cut settles as truncated with its final
    observation in the unroll, and the episodes are reported with their 100 steps."""
    import torch

    from impala_league.agents.model import make_model
    from impala_league.config import load_config
    from impala_league.distributed.actor import Actor
    from impala_league.distributed.wire.params import ParamStore

    cfg = load_config("configs/atari_pong.yaml", [
        f"run.name={run_name}", f"run.dir={tmp_path}", "run.wandb_mode=disabled", "actor.num_envs=2",
        "actor.unroll_length=20", "actor.send_batch=1", "actor.param_sync_every=1000", "agent.hidden=32",
        "env.kwargs.emulator=ale_vector", "env.kwargs.max_episode_frames=400"])
    torch.manual_seed(0)
    ParamStore(redis_client, run_name).publish(make_model(env_spec(cfg.env.name, cfg.env.kwargs), cfg.agent)
                                               .state_dict(), 1)
    actor = Actor(cfg, redis_url, actor_id=0)
    assert [type(env).__name__ for env in actor.envs] == ["GroupSlot"] * 2
    unrolls, episodes = [], []
    actor.send = lambda batch, *_: unrolls.extend(batch) or len(unrolls) >= 12  # 6 per slot: 120 steps each
    report = actor.report
    actor.report = lambda found, flush=False: episodes.extend(found) or report(found, flush)
    actor.run()
    actor.close()
    # 120 steps each and the step both games sat out while the vector env reset them after their cut
    assert actor.envs[0].group.steps == 121 and actor.counters.env_steps == 242
    assert all(u["obs"].shape == (21, 4, 84, 84) and u["obs"].dtype == np.uint8 for u in unrolls)
    truncated = [u for u in unrolls if u["truncated"].any()]
    assert len(truncated) == 2  # one cut per game, at its 100th step: step 19 of its 5th unroll
    for u in truncated:
        assert u["truncated"].nonzero()[0].tolist() == [19] and u["done"][19]
        assert u["final_obs"].shape == (1, 4, 84, 84) and u["final_obs"].any()
    assert [(e["length"], e["winner"]) for e in episodes] == [(100, 0), (100, 0)]
