"""A scored game has exactly one opponent: weight swaps wait for the game's end; the league scores
only games one opponent version played throughout. And weights that travel are verified (SHA-256).
Real Redis, real actor, real tic-tac-toe."""

from __future__ import annotations

import logging

import msgpack
import numpy as np
import pytest
import torch

from impala_league.agents.network import ActorCritic
from impala_league.config import load_config
from impala_league.distributed.actor import Actor
from impala_league.distributed.wire.codec import WeightsCorrupt, encode_weights
from impala_league.distributed.wire.params import ParamStore
from impala_league.envs.registry import env_spec
from impala_league.evaluation.bots import league_bot
from impala_league.league.manager import LeagueManager
from impala_league.league.state import single_opponent
from impala_league.league.players import namespace
from impala_league.league.store import LeagueStore

EXPLOITER = "main_exploiter_0"
SPEC = env_spec("tictactoe")


def _config(tmp_path, run_name, *extra):
    return load_config(None, [f"run.name={run_name}", f"run.dir={tmp_path}", "env.name=tictactoe", "agent.torso=mlp",
                              "agent.hidden=16", "actor.num_envs=8", "actor.unroll_length=4", "league.enabled=true",
                              "league.main_exploiters=1", *extra])


def _weights(cfg, seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return ActorCritic(SPEC.obs_shape, SPEC.num_actions, cfg.agent).state_dict()


def test_swaps_at_random_steps_never_mix_two_opponent_versions_in_a_scored_game(tmp_path, redis_client, redis_url,
                                                                                 run_name):
    cfg = _config(tmp_path, run_name, "league.payoff_decay=1.0")  # payoff counts games, undecayed
    main = ParamStore(redis_client, namespace(run_name, "main"))
    main.publish(_weights(cfg, 0), 1)
    ParamStore(redis_client, namespace(run_name, EXPLOITER)).publish(_weights(cfg, 1), 1)
    LeagueStore(redis_client, run_name).publish_opponents(EXPLOITER, {"main": 0.7, "random": 0.3})
    actor = Actor(cfg, redis_url, actor_id=0, player=EXPLOITER, bots=league_bot)
    actor.sync_params()
    actor.refresh_opponents()

    # Which weights played each opponent move: `stack` sees the (env, agent) pairs, `forward` the model.
    version_of: dict[int, int] = {}
    last_pairs: list = []
    stack, forward = actor.stack, actor.forward
    actor.stack = lambda steps, pairs: last_pairs.__setitem__(slice(None), pairs) or stack(steps, pairs)
    played: list[set[str]] = [set() for _ in actor.envs]  # per env: versions moving for the opponent this game

    def spy(model, obs, masks, keys):
        if model is not actor.policy.model:
            for i, _ in last_pairs:
                played[i].add(f"main@{version_of[id(model)]}")
        return forward(model, obs, masks, keys)

    actor.forward = spy

    def note_versions():
        for loaded in actor.opponents.learners.values():
            version_of[id(loaded.model)] = loaded.version

    rng = np.random.default_rng(0)
    version, results, swaps = 1, [], 0
    for i in range(len(actor.envs)):
        actor.start_episode(i)
    note_versions()
    steps = [env.advance() for env in actor.envs]
    while len(results) < 600:
        if rng.random() < 0.4:  # a swap of main's weights at a random step, mid-game for most envs
            version += 1
            main.publish(_weights(cfg, version), version)
            actor.refresh_opponents()
            note_versions()
            swaps += 1
        actions = actor.choose_actions(steps)
        for i, env in enumerate(actor.envs):
            env.act(actions[i])
            steps[i] = env.advance()
            for episode in steps[i].episodes:
                result = actor.result(i, episode)
                if result["opponent_id"] == "main":
                    result["played_by"] = sorted(played[i])
                results.append(result)
                played[i] = set()
                actor.start_episode(i)
    against_main = [r for r in results if r["opponent_id"] == "main"]
    assert swaps > 150 and len(against_main) > 300
    assert len({r["opponent_version"] for r in against_main}) > 20  # many versions played, one per game
    for r in against_main:
        assert r["played_by"] == [r["opponent_version"]], r  # every opponent move by the named version
    assert all(r["opponent_version"] == "random" for r in results if r["opponent_id"] == "random")

    # The league scores those games and no game without a single named opponent version.
    manager = LeagueManager(cfg, redis_url, tmp_path / run_name)
    manager.consume_results()
    mixed = [{**r, "opponent_version": None} for r in against_main[:10]]
    wrong = [{**r, "opponent_version": "main_exploiter_0@3"} for r in against_main[10:15]]
    for r in results + mixed + wrong:
        redis_client.xadd(f"{run_name}:results", {"data": msgpack.packb({k: v for k, v in r.items()
                                                                          if k != "played_by"})})
    assert manager.consume_results() == len(results)
    assert manager.state.payoff.games(EXPLOITER, "main") == len(against_main)
    assert manager.state.skipped == 15
    actor.close()


def test_single_opponent_rule():
    assert single_opponent({"opponent_id": "main", "opponent_version": "main@12"})
    assert single_opponent({"opponent_id": "main-0000100", "opponent_version": "main-0000100"})
    assert single_opponent({"opponent_id": "random", "opponent_version": "random"})
    assert not single_opponent({"opponent_id": "main"})  # an actor that names no version
    assert not single_opponent({"opponent_id": "main", "opponent_version": "main"})
    assert not single_opponent({"opponent_id": "main", "opponent_version": "main@12,13"})
    assert not single_opponent({"opponent_id": "main-0000100", "opponent_version": "main-0000200"})


def _corrupt(redis_client, key: str) -> None:
    data = bytearray(redis_client.get(key))
    data[-1] ^= 0xFF  # one flipped bit pattern in the last tensor's bytes: still parses as safetensors
    redis_client.set(key, bytes(data))


def test_corrupt_published_weights_are_logged_counted_and_the_previous_ones_kept(tmp_path, redis_client, redis_url,
                                                                                  run_name, caplog):
    cfg = _config(tmp_path, run_name, "league.enabled=false", "league.main_exploiters=0")
    store = ParamStore(redis_client, run_name)
    good = _weights(cfg, 0)
    store.publish(good, 1)
    actor = Actor(cfg, redis_url, actor_id=0)
    actor.sync_params()
    assert actor.policy.version == 1
    store.publish(_weights(cfg, 2), 2)
    _corrupt(redis_client, store.key)
    with caplog.at_level(logging.WARNING):
        actor.sync_params()
    assert actor.policy.version == 1 and actor.counters.corrupt_weights == 1 and store.corrupt_count() == 1
    assert "keeps policy version 1" in caplog.text and "does not match the published" in caplog.text
    for name, tensor in good.items():
        assert torch.equal(actor.policy.model.state_dict()[name], tensor)
    store.publish(_weights(cfg, 3), 3)  # the next good publish is loaded
    actor.sync_params()
    assert actor.policy.version == 3
    actor.close()


def test_weights_without_their_digest_are_refused(redis_client, run_name):
    store = ParamStore(redis_client, run_name, delay=1)
    store.publish(_weights(_config("/tmp", run_name), 0), 1)
    assert store.fetch()[0] == 1
    redis_client.delete(store.history_sha_key)
    with pytest.raises(WeightsCorrupt, match="no SHA-256"):
        store.fetch()
    assert store.corrupt_count() == 1


def test_a_corrupt_snapshot_is_refused_and_counted_by_actors_and_the_league(tmp_path, redis_client, redis_url,
                                                                          run_name, caplog):
    cfg = _config(tmp_path, run_name)
    league = LeagueStore(redis_client, run_name)
    league.put_snapshot("main-0000100", encode_weights(_weights(cfg, 0)))
    _corrupt(redis_client, league.snapshot_key("main-0000100"))
    with pytest.raises(WeightsCorrupt):
        league.snapshot("main-0000100")
    ParamStore(redis_client, namespace(run_name, "main")).publish(_weights(cfg, 1), 1)
    actor = Actor(cfg, redis_url, actor_id=0)
    with caplog.at_level(logging.WARNING):
        assert actor.opponents.get("main-0000100") is None
    assert actor.opponents.corrupt == 1 and league.corrupt_count() == 2
    assert "'main-0000100' cannot be played (WeightsCorrupt" in caplog.text
    # The manager does not snapshot weights that fail their digest.
    main = ParamStore(redis_client, namespace(run_name, "main"))
    main.publish(_weights(cfg, 2), 100)
    _corrupt(redis_client, main.key)
    manager = LeagueManager(cfg, redis_url, tmp_path / run_name)
    assert manager.take_snapshot("main", "test") is None
    assert main.corrupt_count() == 1
    actor.close()


def test_snapshot_files_are_fsynced_before_the_rename_and_their_directory_after(tmp_path, monkeypatch):
    import os

    from impala_league.agents import checkpoint

    events = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(checkpoint.os, "fsync", lambda fd: events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
                        or fsync(fd))
    monkeypatch.setattr(checkpoint.os, "replace", lambda a, b: events.append(("replace", str(b))) or replace(a, b))
    cfg = _config(tmp_path, "fsync")
    model = ActorCritic(SPEC.obs_shape, SPEC.num_actions, cfg.agent)
    path = tmp_path / "snapshots" / "main-0000100.safetensors"
    checkpoint.save_checkpoint(path, model, None, "", {"id": "main-0000100"})
    folder = str(path.parent)
    assert events == [("fsync", str(path) + ".tmp"), ("replace", str(path)), ("fsync", folder),
                      ("fsync", str(path.with_suffix(".json.tmp"))), ("replace", str(path.with_suffix(".json"))),
                      ("fsync", folder)]
