"""Policy lag on purpose (actor.weight_delay): the parameter store keeps the last K+1 publishes and
actors act with the K-th newest. Real Redis, a real actor."""

from __future__ import annotations

import torch

from impala_league.agents.network import ActorCritic
from impala_league.config import load_config
from impala_league.distributed.actor import Actor
from impala_league.distributed.wire.params import ParamStore
from impala_league.envs.registry import env_spec


def _weights(cfg, version: int) -> dict[str, torch.Tensor]:
    """A state dict whose every entry is filled with `version`: which version an actor holds is visible."""
    spec = env_spec("tictactoe")
    model = ActorCritic(spec.obs_shape, spec.num_actions, cfg.agent)
    return {k: torch.full_like(v, float(version)) for k, v in model.state_dict().items()}


def test_store_keeps_k_plus_one_versions_and_readers_get_the_kth_newest(redis_client, run_name):
    cfg = load_config(None, ["env.name=tictactoe", "agent.torso=mlp", "agent.hidden=8"])
    writer = ParamStore(redis_client, run_name, delay=2)
    reader = ParamStore(redis_client, run_name, delay=2)
    assert reader.version() == -1 and reader.fetch() is None
    writer.publish(_weights(cfg, 10), 10)
    assert reader.version() == 10  # fewer than K+1 published: the oldest kept
    for v in (11, 12, 13, 14):
        writer.publish(_weights(cfg, v), v)
    assert reader.version() == 12
    version, state = reader.fetch()
    assert version == 12 and all(bool((t == 12).all()) for t in state.values())
    assert redis_client.llen(f"{run_name}:params:history") == 3  # K + 1 blobs, no more
    assert ParamStore(redis_client, run_name).fetch()[0] == 14  # an undelayed reader gets the latest
    writer.clear()
    assert not redis_client.exists(f"{run_name}:params:history", f"{run_name}:params:history:versions")


def test_actor_acts_with_weights_k_versions_behind(tmp_path, redis_client, redis_url, run_name):
    cfg = load_config(None, [f"run.name={run_name}", f"run.dir={tmp_path}", "env.name=tictactoe", "agent.torso=mlp",
                             "agent.hidden=8", "actor.num_envs=2", "actor.unroll_length=4",
                             "actor.weight_delay=3"])
    learner_side = ParamStore(redis_client, run_name, delay=cfg.actor.weight_delay)
    for v in range(6):
        learner_side.publish(_weights(cfg, v), v)
    actor = Actor(cfg, redis_url, actor_id=0)
    actor.sync_params(wait=True)
    assert actor.policy.version == 2  # latest 5, K = 3
    assert all(bool((p == 2).all()) for p in actor.policy.model.state_dict().values())
    learner_side.publish(_weights(cfg, 6), 6)
    actor.sync_params()
    assert actor.policy.version == 3
    assert all(bool((p == 3).all()) for p in actor.policy.model.state_dict().values())
    actor.close()
