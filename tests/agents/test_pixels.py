"""Pixels: IMPALA's torsos (agents/torsos.py), atari:<Game> (envs/atari.py), reward clipping, and the checks
that keep frames and the other torsos apart."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from impala_league.agents.network import ActorCritic
from impala_league.agents.spec import checked_spec
from impala_league.agents.torsos import ResNetTorso, ShallowTorso
from impala_league.config import AgentConfig, ConfigError
from impala_league.envs.registry import env_spec, make_env
from impala_league.checked_config import load_config
from impala_league.distributed.vtrace import clip_rewards

pytest.importorskip("ale_py")


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_shallow_torso_is_the_papers_network():
    torso = ShallowTorso((4, 84, 84), hidden=256)
    # conv 4->16 8x8: 84 -> 20; conv 16->32 4x4 stride 2: 20 -> 9; FC 32*9*9 -> 256
    assert n_params(torso) == (4 * 16 * 64 + 16) + (16 * 32 * 16 + 32) + (32 * 9 * 9 * 256 + 256) == 676_144
    frames = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    out = torso(frames)
    assert out.shape == (3, 256) and out.dtype == torch.float32 and (out >= 0).all()
    torch.testing.assert_close(out, torso(frames.float()))  # scaled once, inside, whatever the dtype


def test_resnet_torso_is_the_papers_deep_network():
    torso = ResNetTorso((4, 84, 84), channels=(16, 32, 32), hidden=256)
    conv = lambda c_in, c_out: c_in * c_out * 9 + c_out  # noqa: E731
    stacks = sum(conv(c_in, c_out) + 4 * conv(c_out, c_out) for c_in, c_out in ((4, 16), (16, 32), (32, 32)))
    assert n_params(torso) == stacks + 32 * 11 * 11 * 256 + 256  # 84 -> 42 -> 21 -> 11
    assert torso(torch.zeros(2, 4, 84, 84, dtype=torch.uint8)).shape == (2, 256)
    assert sum(isinstance(m, torch.nn.Conv2d) for m in torso.modules()) == 15
    with pytest.raises(ValueError, match="at least one stack"):
        ResNetTorso((4, 84, 84), channels=())


def test_reward_clipping_hand_values():
    r = torch.tensor([-3.0, -1.0, 0.0, 0.5, 1.0, 7.0])
    assert clip_rewards(r, "none") is r
    assert clip_rewards(r, "abs_one").tolist() == [-1.0, -1.0, 0.0, 0.5, 1.0, 1.0]
    soft = clip_rewards(r, "soft_asymmetric")
    expected = [0.3 * math.tanh(-3), 0.3 * math.tanh(-1), 0.0, 5 * math.tanh(0.5), 5 * math.tanh(1), 5 * math.tanh(7)]
    torch.testing.assert_close(soft, torch.tensor(expected))
    assert abs(soft[4].item() - 3.8080) < 1e-4 and abs(soft[1].item() + 0.22848) < 1e-4
    with pytest.raises(ValueError, match="abs_one"):
        clip_rewards(r, "sign")


def test_atari_spec_frames_and_the_papers_protocol():
    spec = env_spec("atari:Pong")
    assert spec.obs_shape == (4, 84, 84) and spec.obs_dtype == np.uint8 and spec.obs_image
    assert spec.num_actions == 6 and spec.frames_per_step == 4 and len(spec.agents) == 1
    assert env_spec("atari:Pong", {"full_action_space": True}).num_actions == 18
    assert env_spec("atari:Breakout", {"frame_skip": 2, "frame_stack": 1}).frames_per_step == 2
    env = make_env("atari:Pong", 3)
    step = env.advance()
    (obs,) = step.observations
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8 and obs.max() > 0
    env.act([0])
    assert env.advance().observations[0].dtype == np.uint8


def test_bad_names_and_kwargs_say_what_to_do():
    with pytest.raises(ValueError, match="Pong"):
        env_spec("atari:Pongg")
    with pytest.raises(ValueError, match="frame_stak"):
        env_spec("atari:Pong", {"frame_stak": 4})
    for game, bad in (("atari:Pong", 2.0), ("atari:Pong", 1.0), ("atari:Pong", -0.1), ("atari2p:pong", 1.0)):
        with pytest.raises(ValueError, match=r"sticky_actions must be a probability in \[0, 1\)"):
            env_spec(game, {"sticky_actions": bad})
    from impala_league.envs import atari, atari2p

    assert atari.DEFAULTS["sticky_actions"] == atari2p.DEFAULTS["sticky_actions"] == 0.25  # Machado et al.'s


def test_torsos_that_cannot_read_the_observation_are_refused_before_anything_starts():
    with pytest.raises(ConfigError, match="agent.torso=mlp cannot read atari:Pong's frames"):
        checked_spec(load_config("configs/atari_pong.yaml", ["agent.torso=mlp"]))
    with pytest.raises(ConfigError, match="shallow"):
        checked_spec(load_config(None, ["agent.torso=shallow"]))  # connect four's board is not frames
    assert checked_spec(load_config("configs/atari_pong.yaml", ["agent.torso=resnet"])).obs_shape == (4, 84, 84)


def test_actor_critic_on_frames_takes_the_recurrent_core():
    cfg = AgentConfig(torso="shallow", hidden=32, core="lstm", core_size=16)
    model = ActorCritic((1, 84, 84), 6, cfg, image=True)  # with a core the stack can be one frame
    features, _ = model.encode(torch.zeros(5, 1, 84, 84, dtype=torch.uint8))
    assert features.shape == (5, 32) and model.core.recurrent
    assert model.heads.policy.in_features == 16  # the heads read the core's output


def test_a_lost_life_settles_the_learning_episode_and_the_game_goes_on():
    env = make_env("atari:Breakout", 0, {"end_on_life_loss": True, "noop_max": 0})
    rng = np.random.default_rng(0)
    step, lives_lost = env.advance(), 0
    for _ in range(2000):
        env.act([int(rng.integers(4))])
        step = env.advance()
        lives_lost += sum(s.done for s in step.settlements)
        if lives_lost == 2:
            break
    assert lives_lost == 2 and not step.episodes  # two learning episodes ended; the game (5 lives) goes on


@pytest.mark.parametrize("bad, reason", [
    (np.zeros((21, 4, 84, 83), np.uint8), r"array 'obs' has shape \[1, 21, 4, 84, 83\], expected \[1, 21, 4, 84, 84\]"),
    (np.zeros((21, 4, 84, 84), np.float32), r"array 'obs' has dtype '<f4', expected '\|u1'"),
])
def test_an_unroll_of_frames_of_the_wrong_shape_or_dtype_is_refused_alone(bad, reason):
    from impala_league.distributed.wire.codec import DecodeError, UnrollSpec, decode_unrolls, encode_unrolls

    uspec, T, A = UnrollSpec(env_spec("atari:Pong"), 20), 20, 6
    rng = np.random.default_rng(0)
    good = {"obs": rng.integers(0, 256, (T + 1, 4, 84, 84), dtype=np.uint8),
            "action_mask": np.ones((T + 1, A), np.uint8), "action": rng.integers(0, A, T),
            "reward": np.zeros(T, np.float32), "done": np.zeros(T, np.uint8), "truncated": np.zeros(T, np.uint8),
            "behaviour_logits": np.zeros((T, A), np.float32)}
    entries = [encode_unrolls([u], unroll_id=str(i), policy_version=0, actor_id=0, env="atari:Pong",
                              compression="zstd", level=1) for i, u in enumerate([good, {**good, "obs": bad}, good])]
    first, refused, last = decode_unrolls(entries, uspec)
    assert isinstance(refused, DecodeError) and re.search(reason, str(refused)), refused
    np.testing.assert_array_equal(first[1]["obs"][0], good["obs"])
    np.testing.assert_array_equal(last[1]["obs"][0], good["obs"])
