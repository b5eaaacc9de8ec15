"""An actor in a league: opponents drawn per episode, learning only in its own seat, and a fallback to
self-play (with a message naming the id) for opponents that cannot be loaded; how it batches what it
sends. Real Redis, real envs."""

from __future__ import annotations

import logging

import numpy as np
import torch

from impala_league.agents.network import ActorCritic
from impala_league.config import load_config
from impala_league.distributed.actor import Actor
from impala_league.distributed.wire.codec import decode_unrolls
from impala_league.distributed.wire.params import ParamStore
from impala_league.envs.registry import env_spec
from impala_league.evaluation.bots import league_bot
from impala_league.league.opponents import Match
from impala_league.league.store import LeagueStore


def _actor(tmp_path, run_name, redis_client, redis_url, *extra) -> Actor:
    cfg = load_config(None, [f"run.name={run_name}", f"run.dir={tmp_path}", "env.name=tictactoe", "agent.torso=mlp",
                             "agent.hidden=16", "actor.num_envs=8", "actor.unroll_length=4",
                             "actor.param_sync_every=1", "league.enabled=true", *extra])
    spec = env_spec("tictactoe")
    ParamStore(redis_client, run_name).publish(ActorCritic(spec.obs_shape, spec.num_actions, cfg.agent).state_dict(), 1)
    return Actor(cfg, redis_url, actor_id=0, bots=league_bot)


def _play(actor: Actor, unrolls_wanted: int) -> tuple[list[dict], list[dict]]:
    """Run the real actor loop, capturing what it sends and reports, until enough unrolls are out."""
    unrolls, results = [], []
    actor.send = lambda batch, *_: unrolls.extend(batch) or len(unrolls) >= unrolls_wanted
    actor.link.results.add_many = results.extend
    actor.run()
    actor.close()  # its id is free again for the next actor of the test
    return unrolls, results


def _own_marks_minus_opponents(obs: np.ndarray) -> int:
    return int(obs[..., 0].sum()) - int(obs[..., 1].sum())


def test_against_a_bot_only_the_learner_seat_learns(tmp_path, redis_client, redis_url, run_name):
    actor = _actor(tmp_path, run_name, redis_client, redis_url)
    LeagueStore(redis_client, run_name).publish_opponents("main", {"random": 1.0})
    unrolls, results = _play(actor, 40)
    assert results and all(r["opponent_id"] == "random" and r["player"] == "main" for r in results)
    assert {r["learner_seat"] for r in results} == {0, 1}
    # Each unroll is one seat's stream: the first player always sees as many own marks as the
    # opponent's, the second one fewer. Learner turns only: no opponent move was recorded as ours,
    # which would also show as a step whose behaviour logits are all zero.
    for u in unrolls:
        diffs = {_own_marks_minus_opponents(o) for o, m in zip(u["obs"], u["action_mask"]) if m.sum() < 9}
        assert len(diffs) <= 1
        assert (np.abs(u["behaviour_logits"]).sum(-1) > 0).all()
    # Every learner move was recorded: steps in sent unrolls cover the learner's share of the moves.
    learner_moves = sum((r["length"] + (1 - r["learner_seat"])) // 2 for r in results)
    assert sum(len(u["action"]) for u in unrolls) <= learner_moves + 8 * 2 * 4  # + what is still buffered


def test_unloadable_opponents_fall_back_to_self_play_and_say_why(tmp_path, redis_client, redis_url, run_name,
                                                                 caplog):
    actor = _actor(tmp_path, run_name, redis_client, redis_url)
    store = LeagueStore(redis_client, run_name)
    store.put_snapshot("main-0000100", b"not safetensors")
    store.publish_opponents("main", {"main-0000999": 0.5, "main-0000100": 0.5})
    with caplog.at_level(logging.WARNING):
        unrolls, results = _play(actor, 8)
    assert results and all(r["opponent_id"] == "self" and r["learner_seat"] == -1 for r in results)
    assert "'main-0000100' cannot be played" in caplog.text
    assert caplog.text.count("'main-0000100' cannot be played") == 1  # said once, not per episode
    # A snapshot Redis does not hold is not a failure: the league manager is asked to load it.
    assert "main-0000999" not in actor.opponents.failed and "main-0000999" in actor.opponents.pending
    assert LeagueStore(redis_client, run_name).take_wants().keys() == {"main-0000999"}


def test_a_snapshot_opponent_is_loaded_from_the_store_and_cached(tmp_path, redis_client, redis_url, run_name):
    from impala_league.distributed.wire.codec import encode_weights

    actor = _actor(tmp_path, run_name, redis_client, redis_url, "league.opponent_cache=1")
    spec = env_spec("tictactoe")
    torch.manual_seed(3)
    frozen = ActorCritic(spec.obs_shape, spec.num_actions, actor.cfg.agent)
    store = LeagueStore(redis_client, run_name)
    store.put_snapshot("main-0000100", encode_weights(frozen.state_dict()))
    store.put_snapshot("main-0000200", encode_weights(frozen.state_dict()))
    model = actor.opponents.get("main-0000100")
    for name, tensor in frozen.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor)
    assert actor.opponents.get("main-0000100") is model  # cached
    actor.opponents.get("main-0000200")
    assert list(actor.opponents.snapshots) == ["main-0000200"]  # LRU with room for one
    store.publish_opponents("main", {"main-0000100": 1.0})
    _, results = _play(actor, 8)
    assert results and {r["opponent_id"] for r in results} == {"main-0000100"}


def test_snapshot_opponents_play_their_argmax_at_temperature_zero(tmp_path, redis_client, redis_url, run_name):
    from impala_league.distributed.wire.codec import encode_weights

    spec = env_spec("tictactoe")
    torch.manual_seed(5)
    frozen = ActorCritic(spec.obs_shape, spec.num_actions, load_config(None, ["agent.torso=mlp", "agent.hidden=16"]).agent)
    LeagueStore(redis_client, run_name).put_snapshot("main-0000100", encode_weights(frozen.state_dict()))
    first_moves = {}
    for temperature in (0.0, 1.0):
        actor = _actor(tmp_path, run_name, redis_client, redis_url, f"league.opponent_temperature={temperature}",
                       "actor.num_envs=64")
        steps = [env.advance() for env in actor.envs]
        for slot in actor.slots:  # the snapshot has the first move in every env
            slot.match = Match("main-0000100", actor.opponents.get("main-0000100"), "main-0000100", learner_seat=1)
        first_moves[temperature] = [a for [a] in actor.choose_actions(steps)]
        obs, masks = actor.stack(steps, [(0, 0)])
        actor.close()
    with torch.no_grad():
        argmax = int(frozen(obs, masks)[0].argmax())
    assert first_moves[0.0] == [argmax] * 64
    assert len(set(first_moves[1.0])) > 1  # sampled: near-uniform logits of a fresh network


def test_finished_unrolls_go_out_send_batch_at_a_time(tmp_path, redis_client, redis_url, run_name):
    actor = _actor(tmp_path, run_name, redis_client, redis_url, "actor.send_batch=8")
    batches = []
    actor.send = lambda batch, *_: batches.append(len(batch)) or sum(batches) >= 40
    actor.run()
    actor.close()
    # 8 envs x 2 seats finish their unrolls a move or two apart: one at a time unless batched; whole
    # entries of 8 go out, the rest waits for the next send.
    assert batches and all(n % 8 == 0 for n in batches)


def test_each_stream_entry_holds_send_batch_unrolls_with_consecutive_ids(tmp_path, redis_client, redis_url, run_name):
    """The real send: entries of exactly 4 unrolls, the first unroll's id naming each (its sequence
    number steps by 4), and the producer's count the unrolls in them."""
    actor = _actor(tmp_path, run_name, redis_client, redis_url, "actor.send_batch=4")
    add = actor.link.trajectories.add
    actor.link.trajectories.add = lambda payloads, **kw: (add(payloads, **kw), setattr(actor, "stopping", actor.counters.sent >= 24))[0]
    actor.run()
    actor.close()
    entries = redis_client.xrange(actor.link.trajectories.key)
    decoded = decode_unrolls([fields[b"data"] for _, fields in entries], actor.unroll_spec)
    assert len(decoded) == actor.counters.sent // 4 >= 6
    assert [h["unrolls"] for h, _ in decoded] == [4] * len(decoded)
    assert [h["unroll_id"] for h, _ in decoded] == [f"0-{actor.token}-{4 * k}" for k in range(len(decoded))]
    assert all(arrays["obs"].shape == (4, 5, 3, 3, 2) for _, arrays in decoded)
    assert actor.link.trajectories.accounting()["produced"] == actor.counters.sent


def test_episode_results_go_out_together_at_most_once_per_interval(tmp_path, run_name, redis_client, redis_url,
                                                                   monkeypatch):
    import impala_league.distributed.actor as actor_module

    actor = _actor(tmp_path, run_name, redis_client, redis_url)
    calls = []
    actor.link.results.add_many = lambda results: calls.append(list(results))
    monkeypatch.setattr(actor_module, "RESULTS_EVERY_S", 3600.0)
    actor.report([{"winner": 0}])
    actor.report([])
    actor.report([{"winner": 1}])
    assert calls == []  # within the interval: queued, no round trip
    actor.report([], flush=True)  # what the loop does when the run ends
    assert calls == [[{"winner": 0}, {"winner": 1}]]
    actor.report([], flush=True)
    assert len(calls) == 1  # nothing pending, nothing sent
    monkeypatch.setattr(actor_module, "RESULTS_EVERY_S", 0.0)
    actor.report([{"winner": -1}])
    assert calls[-1] == [{"winner": -1}]
