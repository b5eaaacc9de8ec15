"""A league that outlives Redis's memory: at most `league.redis_snapshots` snapshots' weights in Redis,
the others loaded back from their files when actors draw them; bad files, a full disk, budgets, the
ratings file's retention. Real Redis, real files."""

from __future__ import annotations

import errno
import json
import logging

import numpy as np
import pytest
import torch

from impala_league.agents.checkpoint import model_state, read_checkpoint
from impala_league.agents.network import ActorCritic
from impala_league.config import ConfigError, load_config
from impala_league.distributed.wire.params import ParamStore
from impala_league.envs.registry import env_spec
from impala_league.league.opponents import Opponents
from impala_league.league.residency import WANT_HOLD_S, choose_resident
from impala_league.league.store import LeagueStore
from impala_league.league.usage import Usage, thin_jsonl


def test_choose_resident_takes_the_newest_then_the_wanted_then_the_heaviest():
    created = {f"main-000000{k}": float(k) for k in range(1, 8)}
    weights = {"main-0000001": 0.5, "main-0000002": 0.2, "main-0000003": 0.2, "main-0000004": 0.1}
    wanted = {"main-0000005": 100.0, "main-0000006": 200.0, "main-0000999": 300.0}  # 999: not a member
    chosen = choose_resident(5, ["main-0000007"], wanted, weights, {"main-0000003"}, created)
    # pinned, wanted latest first, then weight 0.5, then at 0.2 the one Redis holds already.
    assert chosen == ["main-0000007", "main-0000006", "main-0000005", "main-0000001", "main-0000003"]
    assert choose_resident(2, ["main-0000007"], wanted, weights, set(), created) == ["main-0000007", "main-0000006"]
    # With no weights and nothing resident, the newest come first.
    assert choose_resident(3, [], {}, {}, set(), created) == ["main-0000007", "main-0000006", "main-0000005"]


def test_redis_snapshots_below_the_cache_or_the_learners_is_a_config_error():
    base = ["league.enabled=true"]
    with pytest.raises(ConfigError, match="league.redis_snapshots=8 is below league.opponent_cache=16"):
        load_config(None, base + ["league.redis_snapshots=8"])
    with pytest.raises(ConfigError, match="the 4 learning players"):
        load_config(None, base + ["league.redis_snapshots=3", "league.opponent_cache=2", "league.main_exploiters=2",
                                  "league.league_exploiters=1"])
    assert load_config(None, base + ["league.redis_snapshots=4", "league.opponent_cache=2",
                                     "league.main_exploiters=2", "league.league_exploiters=1"]).league.redis_snapshots == 4


def _config(tmp_path, run_name, *extra):
    return load_config(None, [f"run.name={run_name}", f"run.dir={tmp_path}", "env.name=tictactoe", "agent.torso=mlp",
                              "agent.hidden=16", "league.enabled=true", "league.min_games=2", "league.snapshot_every=1",
                              "league.bots=[]", "league.redis_snapshots=2", "league.opponent_cache=1", *extra])


def _weights(cfg, seed: int) -> dict[str, torch.Tensor]:
    spec = env_spec(cfg.env.name)
    torch.manual_seed(seed)
    return ActorCritic(spec.obs_shape, spec.num_actions, cfg.agent).state_dict()


def _snapshot_keys(redis_client, run_name) -> list[str]:
    return sorted(k.decode() for k in redis_client.scan_iter(match=f"{run_name}:league:snap:*", count=1000)
                  if not k.endswith(b":sha256"))


def _grow(manager, redis_client, cfg, run_name, versions) -> None:
    """Publish each version and let the manager snapshot it, checking the bound after every step."""
    for v in versions:
        ParamStore(redis_client, run_name).publish(_weights(cfg, v), v)
        manager.snapshot_due_learners()
        assert len(_snapshot_keys(redis_client, run_name)) <= cfg.league.redis_snapshots
        manager.publish()
        manager.rebalance_snapshots()
        assert len(_snapshot_keys(redis_client, run_name)) <= cfg.league.redis_snapshots


def test_redis_holds_at_most_the_bound_and_an_evicted_snapshot_is_played_with_its_own_weights(
        tmp_path, redis_client, redis_url, run_name):
    from impala_league.league.manager import LeagueManager

    cfg = _config(tmp_path, run_name)
    manager = LeagueManager(cfg, redis_url, tmp_path / run_name)
    _grow(manager, redis_client, cfg, run_name, range(1, 7))
    assert len(manager.state.snapshots()) == 6  # every snapshot stays a member
    store = LeagueStore(redis_client, run_name)
    assert "main-0000006" in store.resident()  # the newest is pinned
    assert {"main-0000001", "main-0000002"} <= manager.residency.evicted_ever
    # An actor draws an evicted snapshot: it asks for it and plays another opponent meanwhile.
    store.publish_opponents("main", {"main-0000001": 1.0})
    opponents = Opponents(redis_client, cfg, env_spec("tictactoe"), "main", 0, np.random.SeedSequence(1))
    opponents.read_distribution()
    match = opponents.draw(set())
    assert match.opponent == "self" and opponents.unavailable == 1 and "main-0000001" in opponents.pending
    # The manager loads it from its file at its next pass; the actor fetches it at its next sync.
    manager.rebalance_snapshots()
    assert "main-0000001" in store.resident() and manager.residency.loads == 1
    assert len(_snapshot_keys(redis_client, run_name)) == 2
    opponents.read_distribution()
    opponents.refresh()
    assert "main-0000001" in opponents.snapshots and not opponents.pending
    match = opponents.draw(set())
    assert (match.opponent, match.version) == ("main-0000001", "main-0000001")
    for name, tensor in _weights(cfg, 1).items():
        assert torch.equal(match.policy.state_dict()[name], tensor)
    # A game against it counts as a game against an evicted snapshot.
    redis_client.xgroup_create(f"{run_name}:results", "league", id="0", mkstream=True)
    import msgpack
    redis_client.xadd(f"{run_name}:results", {"data": msgpack.packb(
        {"player": "main", "opponent_id": "main-0000001", "opponent_version": "main-0000001", "learner_seat": 0,
         "winner": 0, "length": 5, "returns": [1.0, -1.0]})})
    assert manager.consume_results() == 1 and manager.state.evicted_games == 1


def test_a_wanted_snapshot_stays_for_the_hold_then_the_weights_decide(tmp_path, redis_client, redis_url, run_name):
    from impala_league.league.manager import LeagueManager

    cfg = _config(tmp_path, run_name)
    manager = LeagueManager(cfg, redis_url, tmp_path / run_name)
    _grow(manager, redis_client, cfg, run_name, range(1, 5))
    store = LeagueStore(redis_client, run_name)
    store.want("main-0000002")
    store.want("main-0000777")  # not a member: ignored
    manager.rebalance_snapshots()
    assert store.resident() == {"main-0000004", "main-0000002"}
    assert manager.residency.wants == 1
    manager.rebalance_snapshots()  # still held: no want since, but within WANT_HOLD_S
    assert "main-0000002" in store.resident()
    manager.residency.wanted["main-0000002"] -= WANT_HOLD_S + 1
    manager.state.distributions = {"main": {"main-0000003": 1.0}}
    manager.rebalance_snapshots()
    assert store.resident() == {"main-0000004", "main-0000003"}


def test_a_missing_or_corrupt_file_of_an_evicted_snapshot_takes_it_out_of_the_league_and_the_run_goes_on(
        tmp_path, redis_client, redis_url, run_name, caplog):
    from impala_league.league.manager import LeagueManager

    cfg = _config(tmp_path, run_name, "league.redis_snapshots=3")
    run_dir = tmp_path / run_name
    manager = LeagueManager(cfg, redis_url, run_dir)
    _grow(manager, redis_client, cfg, run_name, range(1, 6))
    corrupt = run_dir / "league" / "snapshots" / "main-0000001.safetensors"
    data = bytearray(corrupt.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit in a weight
    corrupt.write_bytes(bytes(data))
    missing = run_dir / "league" / "snapshots" / "main-0000002.safetensors"
    missing.unlink()
    store = LeagueStore(redis_client, run_name)
    store.want("main-0000001")
    store.want("main-0000002")
    with caplog.at_level(logging.ERROR):
        manager.rebalance_snapshots()
    assert f"snapshot main-0000001 leaves the league: {corrupt} is corrupt" in caplog.text
    assert f"snapshot main-0000002 leaves the league: checkpoint not found: {missing}" in caplog.text
    assert manager.state.snapshots() == ["main-0000003", "main-0000004", "main-0000005"]
    assert set(manager.state.dropped) == {"main-0000001", "main-0000002"}
    assert len(_snapshot_keys(redis_client, run_name)) <= 3
    _grow(manager, redis_client, cfg, run_name, [6])  # the run goes on
    manager.save()
    state = json.loads((run_dir / "league" / "state.json").read_text())
    assert "main-0000006" in state["members"] and "main-0000001" not in state["members"]
    assert "is corrupt" in state["dropped"]["main-0000001"]


def test_a_full_disk_while_writing_a_snapshot_leaves_the_previous_files_whole(tmp_path, redis_client, redis_url,
                                                                            run_name, monkeypatch, caplog):
    import impala_league.agents.checkpoint as checkpoint
    from impala_league.league.manager import LeagueManager

    cfg = _config(tmp_path, run_name)
    run_dir = tmp_path / run_name
    manager = LeagueManager(cfg, redis_url, run_dir)
    _grow(manager, redis_client, cfg, run_name, [1])
    real_save_file = checkpoint.save_file

    def disk_full(tensors, path, metadata=None):
        with open(path, "wb") as f:
            f.write(b"\0" * 100)  # what fitted
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "save_file", disk_full)
    ParamStore(redis_client, run_name).publish(_weights(cfg, 2), 2)
    with caplog.at_level(logging.ERROR):
        manager.snapshot_due_learners()
    assert "no snapshot of main this pass" in caplog.text and "No space left on device" in caplog.text
    assert manager.state.snapshots() == ["main-0000001"]
    files = sorted(p.name for p in (run_dir / "league" / "snapshots").iterdir())
    assert files == ["main-0000001.json", "main-0000001.safetensors"]  # no partial file left
    tensors, _ = read_checkpoint(run_dir / "league" / "snapshots" / "main-0000001.safetensors")
    assert all(torch.equal(model_state(tensors)[k], v) for k, v in _weights(cfg, 1).items())
    monkeypatch.setattr(checkpoint, "save_file", real_save_file)
    manager.snapshot_due_learners()  # the disk has room again: the next pass takes it
    assert manager.state.snapshots() == ["main-0000001", "main-0000002"]


def test_resume_adopts_a_snapshot_written_after_the_last_save_and_fills_redis_up_to_the_bound(
        tmp_path, redis_client, redis_url, run_name):
    from impala_league.league.manager import LeagueManager

    cfg = _config(tmp_path, run_name)
    run_dir = tmp_path / run_name
    manager = LeagueManager(cfg, redis_url, run_dir)
    _grow(manager, redis_client, cfg, run_name, range(1, 5))
    manager.save()
    _grow(manager, redis_client, cfg, run_name, [5])  # then killed before saving
    redis_client.delete(*redis_client.keys(f"{run_name}:league:*"))  # and a fresh Redis
    resumed = LeagueManager(cfg, redis_url, run_dir, resume=True)
    assert resumed.state.snapshots() == [f"main-000000{k}" for k in range(1, 6)]
    assert resumed.state.last_snapshot["main"] == 5 and resumed.state.lineage["main"] == "main-0000005"
    assert resumed.state.members["main-0000005"].parent == "main-0000004"
    assert _snapshot_keys(redis_client, run_name) == []  # nothing written before it holds the lease
    resumed.publish()
    resumed.rebalance_snapshots(fill=True)
    assert len(_snapshot_keys(redis_client, run_name)) == 2
    assert "main-0000005" in LeagueStore(redis_client, run_name).resident()


def test_ratings_file_is_thinned_to_every_other_line_keeping_both_ends(tmp_path):
    path = tmp_path / "ratings.jsonl"
    path.write_text("".join(f'{{"n": {k}}}\n' for k in range(10)) + '{"n": 1')  # a cut last line
    assert not thin_jsonl(path, 10_000)
    assert thin_jsonl(path, 50)
    assert [json.loads(line)["n"] for line in path.read_text().splitlines()] == [0, 2, 4, 6, 8, 9]


def test_usage_warns_with_the_numbers_past_a_budget(tmp_path, redis_client, caplog):
    (tmp_path / "big").write_bytes(b"\0" * 3 * 2**20)
    usage = Usage(tmp_path, disk_budget_mb=2, redis_budget_mb=100_000)
    with caplog.at_level(logging.WARNING):
        measured = usage.check(redis_client, now=0.0, wall=0.0)
    assert measured["run_dir_bytes"] == 3 * 2**20 and measured["used_memory"] > 0
    assert f"the run directory {tmp_path} holds 3 MB (league.disk_budget_mb=2)" in caplog.text
    assert "Redis uses" not in caplog.text
    caplog.clear()
    usage.check(redis_client, now=1.0, wall=1.0)
    assert "over budget" not in caplog.text  # warned at most every WARN_EVERY_S
    assert not usage.due(1.0) and usage.due(100.0)


def test_at_most_loads_per_pass_snapshots_come_back_per_pass_and_the_bound_holds(tmp_path, redis_client, redis_url,
                                                                                run_name):
    from impala_league.league.manager import LeagueManager
    from impala_league.league.residency import LOADS_PER_PASS

    cfg = _config(tmp_path, run_name, "league.redis_snapshots=12")
    manager = LeagueManager(cfg, redis_url, tmp_path / run_name)
    _grow(manager, redis_client, cfg, run_name, range(1, 25))
    store = LeagueStore(redis_client, run_name)
    resident_before = store.resident()
    asked = [f"main-{k:07d}" for k in range(1, 12)]  # 11 evicted snapshots, asked for
    assert not set(asked) & resident_before
    for s in asked:
        store.want(s)
    loads = manager.residency.loads
    manager.rebalance_snapshots()
    assert manager.residency.loads - loads == LOADS_PER_PASS == 8
    assert len(store.resident()) == 12 and len(_snapshot_keys(redis_client, run_name)) == 12
    manager.rebalance_snapshots()  # the other 3 at the next pass
    assert store.resident() == set(asked) | {"main-0000024"}


def test_an_actor_that_draws_an_evicted_snapshot_plays_one_it_can_play_now(tmp_path, redis_client, run_name):
    cfg = _config(tmp_path, run_name, "league.redis_snapshots=3", "league.bots=[random]")
    store = LeagueStore(redis_client, run_name)
    from impala_league.distributed.wire.codec import encode_weights

    store.put_snapshot("main-0000003", encode_weights(_weights(cfg, 3)))
    # 98 snapshots drawn with 0.5% each, one of them resident; a bot; self-play half the games.
    dist = {f"main-{k:07d}": 0.49 / 98 for k in range(1, 99)} | {"random": 0.01, "self": 0.5}
    store.publish_opponents("main", dist)
    from impala_league.evaluation.bots import league_bot

    opponents = Opponents(redis_client, cfg, env_spec("tictactoe"), "main", 0, np.random.SeedSequence(2),
                          bots=league_bot)
    opponents.read_distribution()
    assert opponents._playable_now("main-0000050") == pytest.approx({"random": 0.01, "self": 0.5,
                                                                     "main-0000003": 0.005})
    played = [opponents.draw(set()).opponent for _ in range(300)]
    assert set(played) == {"random", "self", "main-0000003"}
    # An evicted draw is replaced by a league member, never by self-play: self-play keeps its half
    # (it would be 97% if the replacement were drawn from everything playable).
    assert 0.4 < played.count("self") / len(played) < 0.6
    # The replacements follow the distribution among those playable: random 0.01 : main-0000003 0.005,
    # so random gets 0.01 + 0.485 * 2/3 = 0.33 of the games and main-0000003 0.005 + 0.485 / 3 = 0.17.
    assert 0.25 < played.count("random") / len(played) < 0.42
    assert 0.10 < played.count("main-0000003") / len(played) < 0.24
    assert opponents.unavailable >= 100 and len(store.take_wants()) >= 60
