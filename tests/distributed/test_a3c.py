"""A3C baseline: gradients cross Redis as safetensors bytes inside msgpack and the parameter server
applies them with the learner's optimizer. A short real A3C run is part of tests/analysis/test_compare.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from impala_league.agents.core import forward_batch
from impala_league.agents.heads import DiscreteHead
from impala_league.agents.network import ActorCritic
from impala_league.batch import Batch
from impala_league.config import AgentConfig, ConfigError, LearnerConfig, load_config
from impala_league.distributed.a3c import apply_gradients, decode_gradients, encode_gradients
from impala_league.distributed.learner.update import learn_step, make_optimizer
from impala_league.distributed.wire.codec import DecodeError
from impala_league.envs.registry import env_spec
from impala_league.losses.actor_critic import actor_critic_loss

PICKLED_EMPTY_DICT = b"\x80\x04\x95\x04\x00\x00\x00\x00\x00\x00\x00}\x94."  # an empty dict in pickle protocol 4


def _batch(spec, T=4, B=3, seed=0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    A = spec.num_actions
    return Batch(obs=torch.randint(0, 2, (T + 1, B, *spec.obs_shape), generator=g, dtype=torch.int8),
                 action_mask=torch.ones(T + 1, B, A, dtype=torch.uint8),
                 action=torch.randint(0, A, (T, B), generator=g), reward=torch.randn(T, B, generator=g),
                 done=torch.zeros(T, B, dtype=torch.bool), behaviour_logits=torch.randn(T, B, A, generator=g))


def test_a_pushed_gradient_applied_by_the_server_equals_the_learners_own_a3c_update():
    """Worker: loss + backward + encode; server: decode + apply. Same weights as one learn_step with
    correction=none and the same Adam, to float32 precision."""
    spec = env_spec("tictactoe")
    cfg = LearnerConfig(correction="none", grad_norm_clip=0.5)  # small clip: the server must clip too
    torch.manual_seed(0)
    worker = ActorCritic(spec.obs_shape, spec.num_actions, AgentConfig(torso="mlp", hidden=16))
    server = ActorCritic(spec.obs_shape, spec.num_actions, AgentConfig(torso="mlp", hidden=16))
    reference = ActorCritic(spec.obs_shape, spec.num_actions, AgentConfig(torso="mlp", hidden=16))
    server.load_state_dict(worker.state_dict())
    reference.load_state_dict(worker.state_dict())
    batch = _batch(spec)
    loss, parts = actor_critic_loss(*forward_batch(worker, batch), batch, cfg, DiscreteHead())
    loss.backward()
    data = encode_gradients(worker, policy_version=7, actor_id=2, agent_steps=12, stats={k: float(v) for k, v in parts.items()})
    assert isinstance(data, bytes) and b"pickle" not in data
    header, grads = decode_gradients(data, {n: tuple(p.shape) for n, p in server.named_parameters()})
    assert header["policy_version"] == 7 and header["agent_steps"] == 12
    assert np.isclose(header["stats"]["loss"], float(loss.detach()))
    server_step = apply_gradients(server, make_optimizer(server, cfg), grads, cfg)
    reference_stats = learn_step(reference, make_optimizer(reference, cfg), batch, cfg)
    assert np.isclose(server_step["grad_norm"], reference_stats["grad_norm"], rtol=1e-6)
    assert server_step["grad_norm"] > 0.5  # the clip was active
    for (name, a), b in zip(server.state_dict().items(), reference.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)
    assert any(not torch.equal(a, b) for a, b in zip(server.state_dict().values(), worker.state_dict().values()))


def test_malformed_gradients_are_refused_with_a_reason():
    spec = env_spec("tictactoe")
    model = ActorCritic(spec.obs_shape, spec.num_actions, AgentConfig(torso="mlp", hidden=16))
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    stats = dict.fromkeys(["loss", "policy_gradient_loss", "baseline_loss", "entropy", "mean_rho",
                           "rho_clipped_fraction", "c_clipped_fraction"], 0.0)
    with pytest.raises(DecodeError, match="not msgpack|must be a map"):
        decode_gradients(PICKLED_EMPTY_DICT, shapes)
    with pytest.raises(DecodeError, match="names differ"):
        other = ActorCritic(spec.obs_shape, spec.num_actions, AgentConfig(torso="mlp", hidden=16, mlp_layers=3))
        decode_gradients(encode_gradients(other, policy_version=0, actor_id=0, agent_steps=1, stats=stats), shapes)
    for p in model.parameters():
        p.grad = torch.full_like(p, float("nan"))
    with pytest.raises(DecodeError, match="nan or inf"):
        decode_gradients(encode_gradients(model, policy_version=0, actor_id=0, agent_steps=1, stats=stats), shapes)


def test_a3c_with_a_league_is_a_config_error():
    with pytest.raises(ConfigError, match="a3c trains without a league"):
        load_config(None, ["learner.algo=a3c", "league.enabled=true"])
