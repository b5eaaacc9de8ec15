"""League logic against hand-computed values: PFSP, payoff decay, Elo, the role mixes; and the manager
(snapshots, results, resets, resume) against a real Redis."""

from __future__ import annotations

import json
import math

import msgpack
import numpy as np
import pytest
import torch

from impala_league.agents.network import ActorCritic
from impala_league.agents.policy import load_policy
from impala_league.config import LeagueConfig, load_config
from impala_league.distributed.wire.params import ParamStore
from impala_league.envs.registry import env_spec
from impala_league.league.matchmaking import (league_exploiter_opponents, main_agent_opponents,
                                              main_exploiter_opponents, pfsp_probabilities)
from impala_league.league.payoff import ELO_SCALE, EloRatings, PayoffTable, episode_score
from impala_league.league.store import LeagueStore

# -- PFSP --------------------------------------------------------------------------------------------


def test_pfsp_hard_weighting_matches_hand_computation():
    # f(x) = (1-x)^2: 0.64, 0.25, 0.01, and 0.25 for the unknown (x = 1/2); total 1.15.
    probs = pfsp_probabilities([0.2, 0.5, 0.9, None], "hard", 2.0)
    np.testing.assert_allclose(probs, [0.64 / 1.15, 0.25 / 1.15, 0.01 / 1.15, 0.25 / 1.15], rtol=1e-12)


def test_pfsp_variance_and_uniform_weightings():
    # f(x) = x(1-x): 0.16, 0.25, 0.09, 0.25; total 0.75.
    np.testing.assert_allclose(pfsp_probabilities([0.2, 0.5, 0.9, None], "variance"),
                               [0.16 / 0.75, 0.25 / 0.75, 0.09 / 0.75, 0.25 / 0.75], rtol=1e-12)
    np.testing.assert_allclose(pfsp_probabilities([0.2, 0.9, 1.0], "uniform"), [1 / 3] * 3)


def test_pfsp_hard_with_exponent_one_is_linear():
    np.testing.assert_allclose(pfsp_probabilities([0.0, 0.5, 0.75], "hard", 1.0), [1 / 1.75, 0.5 / 1.75, 0.25 / 1.75])


def test_pfsp_falls_back_to_uniform_when_every_weight_is_zero():
    np.testing.assert_allclose(pfsp_probabilities([1.0, 1.0], "hard"), [0.5, 0.5])
    np.testing.assert_allclose(pfsp_probabilities([0.0, 1.0, 1.0], "variance"), [1 / 3] * 3)


def test_pfsp_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown PFSP weighting"):
        pfsp_probabilities([0.5], "squared")
    with pytest.raises(ValueError, match="at least one"):
        pfsp_probabilities([], "hard")


# -- payoff ------------------------------------------------------------------------------------------


def test_payoff_decay_matches_hand_computation():
    table = PayoffTable(decay=0.5, min_games=1)
    table.add("a", "b", 1.0)  # a: w 1
    table.add("a", "b", 0.0)  # a: w 0.5, l 1
    table.add("a", "b", 0.5)  # a: w 0.25, l 0.5, d 1
    mine, theirs = table.records[("a", "b")], table.records[("b", "a")]
    assert (mine.wins, mine.draws, mine.losses) == (0.25, 1.0, 0.5)
    assert (theirs.wins, theirs.draws, theirs.losses) == (0.5, 1.0, 0.25)
    assert table.games("a", "b") == 1.75
    assert table.win_rate("a", "b") == pytest.approx((0.25 + 0.5) / 1.75)
    assert table.win_rate("b", "a") == pytest.approx((0.5 + 0.5) / 1.75)


def test_payoff_win_rate_counts_only_after_min_games():
    table = PayoffTable(decay=1.0, min_games=3)
    table.add("a", "b", 1.0)
    table.add("a", "b", 1.0)
    assert table.win_rate("a", "b") is None and table.win_rate("a", "c") is None
    table.add("a", "b", 0.5)
    assert table.win_rate("a", "b") == pytest.approx(2.5 / 3)


def test_payoff_decay_only_touches_the_pair_that_played():
    table = PayoffTable(decay=0.5, min_games=1)
    table.add("a", "b", 1.0)
    table.add("a", "c", 1.0)
    assert table.records[("a", "b")].wins == 1.0


def test_payoff_rejects_bad_scores_and_self_games_and_round_trips_json():
    table = PayoffTable(decay=0.9, min_games=1)
    with pytest.raises(ValueError, match="score"):
        table.add("a", "b", 0.7)
    with pytest.raises(ValueError, match="itself"):
        table.add("a", "a", 1.0)
    table.add("a", "b", 1.0)
    table.add("c", "b", 0.5)
    again = PayoffTable.from_json(json.loads(json.dumps(table.to_json())), 0.9, 1)
    assert again.records == table.records
    again.remove("b")
    assert again.records == {}


def test_episode_score_from_the_learners_seat():
    assert episode_score({"winner": 1, "learner_seat": 1}) == 1.0
    assert episode_score({"winner": 0, "learner_seat": 1}) == 0.0
    assert episode_score({"winner": -1, "learner_seat": 0}) == 0.5


# -- Elo ---------------------------------------------------------------------------------------------


def test_elo_updates_match_hand_computation():
    elo = EloRatings(k=32)
    elo.update("a", "b", 1.0)  # E = 0.5: a +16, b -16
    assert (elo.get("a").elo, elo.get("b").elo) == (16.0, -16.0)
    elo.update("b", "a", 1.0)  # E_b = 1 / (1 + 10^(32/400)) = 0.4540781
    expected_b = 1 / (1 + 10 ** (32 / 400))
    assert expected_b == pytest.approx(0.4540781, abs=1e-7)
    assert elo.get("b").elo == pytest.approx(-16 + 32 * (1 - expected_b))  # 1.4695
    assert elo.get("b").elo == pytest.approx(1.4695, abs=1e-4)
    assert elo.get("a").elo == pytest.approx(-1.4695, abs=1e-4)
    info = 0.25 + expected_b * (1 - expected_b)
    assert elo.get("a").information == pytest.approx(info)
    assert elo.get("a").uncertainty == pytest.approx(ELO_SCALE / math.sqrt(info + 1))
    assert ELO_SCALE == pytest.approx(173.7178, abs=1e-4)


def test_elo_of_a_new_snapshot_is_its_learners():
    elo = EloRatings(k=8)
    for _ in range(10):
        elo.update("main", "random", 1.0)
    elo.copy_to("main", "main-0000100")
    assert elo.get("main-0000100") == elo.get("main") and elo.get("main-0000100") is not elo.get("main")
    assert EloRatings.from_json(elo.to_json(), 8).ratings == elo.ratings


# -- role mixes --------------------------------------------------------------------------------------


def _payoff(results: dict[tuple[str, str], tuple[int, int]]) -> PayoffTable:
    table = PayoffTable(decay=1.0, min_games=1)
    for (a, b), (wins, losses) in results.items():
        for _ in range(wins):
            table.add(a, b, 1.0)
        for _ in range(losses):
            table.add(a, b, 0.0)
    return table


def test_main_agent_mix_matches_hand_computation():
    # main vs s1: 1-3 (0.25, forgotten), vs s2: 3-1 (0.75), random unplayed (0.5).
    payoff = _payoff({("main", "s1"): (1, 3), ("main", "s2"): (3, 1)})
    dist = main_agent_opponents("main", payoff, ["s1", "s2", "random"], ["s1", "s2"], LeagueConfig())
    # hard PFSP weights 0.5625, 0.0625, 0.25 (total 0.875); forgotten = {s1}.
    assert dist["self"] == pytest.approx(0.35)
    assert dist["s1"] == pytest.approx(0.5 * 0.5625 / 0.875 + 0.15)
    assert dist["s2"] == pytest.approx(0.5 * 0.0625 / 0.875)
    assert dist["random"] == pytest.approx(0.5 * 0.25 / 0.875)
    assert sum(dist.values()) == pytest.approx(1.0)


def test_main_agent_without_a_league_is_self_play_and_unforgotten_share_goes_to_self_play():
    cfg = LeagueConfig()
    assert main_agent_opponents("main", PayoffTable(), [], [], cfg) == {"self": 1.0}
    dist = main_agent_opponents("main", PayoffTable(), ["random"], [], cfg)
    assert dist == pytest.approx({"self": 0.5, "random": 0.5})


def test_main_agent_bot_share_is_pfsp_over_the_bots_on_top_of_the_league_share():
    # main vs s1 1-1 (0.5, not forgotten), vs random 9-1 (0.9), vs tactical 3-1 (0.75).
    payoff = _payoff({("main", "s1"): (1, 1), ("main", "random"): (9, 1), ("main", "tactical"): (3, 1)})
    dist = main_agent_opponents("main", payoff, ["s1", "random", "tactical"], ["s1"], LeagueConfig(bot_share=0.25),
                                bots=["random", "tactical"])
    # Weights 0.35 + 0.15 (nothing forgotten: to self-play), 0.5 league, 0.25 bots; total 1.25.
    # Hard PFSP over the league: 0.25, 0.01, 0.0625 (total 0.3225); over the bots: 0.01, 0.0625 (0.0725).
    assert dist["self"] == pytest.approx(0.5 / 1.25)
    assert dist["s1"] == pytest.approx(0.5 * 0.25 / 0.3225 / 1.25)
    assert dist["random"] == pytest.approx((0.5 * 0.01 / 0.3225 + 0.25 * 0.01 / 0.0725) / 1.25)
    assert dist["tactical"] == pytest.approx((0.5 * 0.0625 / 0.3225 + 0.25 * 0.0625 / 0.0725) / 1.25)
    assert sum(dist.values()) == pytest.approx(1.0)


def test_main_exploiter_plays_the_main_agent_unless_hopeless():
    cfg = LeagueConfig()
    assert main_exploiter_opponents("main_exploiter_0", PayoffTable(), ["main-1"], cfg) == {"main": 1.0}
    hopeless = _payoff({("main_exploiter_0", "main"): (0, 20), ("main_exploiter_0", "main-1"): (1, 1)})
    dist = main_exploiter_opponents("main_exploiter_0", hopeless, ["main-1", "main-2"], cfg)
    assert dist == pytest.approx({"main-1": 0.5, "main-2": 0.5})  # variance: 0.25 and 0.25 (unplayed)


def test_league_exploiter_pfsp_over_the_league():
    cfg = LeagueConfig()
    assert league_exploiter_opponents("league_exploiter_0", PayoffTable(), [], cfg) == {"main": 1.0}
    payoff = _payoff({("league_exploiter_0", "a"): (1, 1)})
    dist = league_exploiter_opponents("league_exploiter_0", payoff, ["a", "b"], cfg)
    assert dist == pytest.approx({"a": 0.5, "b": 0.5})


# -- the manager over a real Redis -------------------------------------------------------------------


def _config(tmp_path, run_name, *extra):
    return load_config(None, [f"run.name={run_name}", f"run.dir={tmp_path}", "env.name=tictactoe",
                              "agent.torso=mlp", "agent.hidden=16", "league.enabled=true", "league.min_games=2",
                              "league.snapshot_every=100", "league.payoff_decay=1.0", *extra])


def _publish(redis_client, cfg, player_ns: str, version: int, agent_steps: int = 0, seed: int = 0) -> ActorCritic:
    spec = env_spec(cfg.env.name, cfg.env.kwargs)
    torch.manual_seed(seed)
    model = ActorCritic(spec.obs_shape, spec.num_actions, cfg.agent)
    ParamStore(redis_client, player_ns).publish(model.state_dict(), version, agent_steps)
    return model


def _result(player, opponent, learner_seat, winner):
    """A result as actors report it; a learner opponent (`main`, exploiters) at version 7."""
    version = f"{opponent}@7" if opponent == "main" or opponent.endswith(tuple("0123456789")) and "-" not in opponent \
        else opponent
    return {"player": player, "opponent_id": opponent, "opponent_version": version, "learner_seat": learner_seat,
            "winner": winner, "length": 5, "returns": [0.0, 0.0]}


def _add_results(redis_client, run_name, results):
    for r in results:
        redis_client.xadd(f"{run_name}:results", {"data": msgpack.packb(r)})


def test_manager_snapshots_on_schedule_into_a_loadable_file_and_redis(tmp_path, redis_client, redis_url, run_name):
    from impala_league.league.manager import LeagueManager

    cfg = _config(tmp_path, run_name)
    manager = LeagueManager(cfg, redis_url, tmp_path / run_name)
    model = _publish(redis_client, cfg, run_name, 99, agent_steps=1234)
    manager.snapshot_due_learners()
    assert manager.state.snapshots() == []  # 99 < snapshot_every
    model = _publish(redis_client, cfg, run_name, 100, agent_steps=5678)
    manager.snapshot_due_learners()
    assert manager.state.snapshots() == ["main-0000100"]
    info = manager.state.members["main-0000100"]
    assert (info.player, info.role, info.step, info.agent_steps, info.parent) == ("main", "main", 100, 5678, None)
    policy = load_policy(tmp_path / run_name / "league" / "snapshots" / "main-0000100.safetensors")
    for name, tensor in model.state_dict().items():
        assert torch.equal(policy.model.state_dict()[name], tensor)
    assert LeagueStore(redis_client, run_name).has_snapshot("main-0000100")
    _publish(redis_client, cfg, run_name, 200)
    manager.snapshot_due_learners()
    assert manager.state.members["main-0000200"].parent == "main-0000100"


def test_manager_scores_league_games_and_skips_self_play_and_junk(tmp_path, redis_client, redis_url, run_name):
    from impala_league.league.manager import LeagueManager

    cfg = _config(tmp_path, run_name)
    manager = LeagueManager(cfg, redis_url, tmp_path / run_name)
    manager.consume_results()  # creates the group at the stream's end
    _add_results(redis_client, run_name, [
        _result("main", "random", 0, 0), _result("main", "random", 1, 0), _result("main", "random", 1, -1),
        _result("main", "self", -1, 0), _result("main", "nobody", 0, 0)])
    redis_client.xadd(f"{run_name}:results", {"data": b"\xc1"})
    assert manager.consume_results() == 3
    record = manager.state.payoff.records[("main", "random")]
    assert (record.wins, record.draws, record.losses) == (1, 1, 1)
    assert manager.state.skipped == 2  # the unknown opponent and the malformed entry
    assert manager.state.elo.get("main").elo != 0.0
    assert manager.consume_results() == 0  # acknowledged: nothing is scored twice


def test_manager_publishes_distributions_actors_can_read(tmp_path, redis_client, redis_url, run_name):
    from impala_league.league.manager import LeagueManager

    cfg = _config(tmp_path, run_name, "league.main_exploiters=1", "league.bots=[random]")
    manager = LeagueManager(cfg, redis_url, tmp_path / run_name)
    manager.publish()
    store = LeagueStore(redis_client, run_name)
    assert store.opponents("main") == pytest.approx({"self": 0.5, "random": 0.5})
    assert store.opponents("main_exploiter_0") == {"main": 1.0}
    assert store.opponents("league_exploiter_0") is None
    redis_client.set(f"{run_name}:league:opponents:main", b"{not json")
    with pytest.raises(ValueError, match="malformed"):
        store.opponents("main")


def test_main_exploiter_that_beats_the_main_agent_is_snapshotted_and_reset(tmp_path, redis_client, redis_url,
                                                                          run_name):
    from impala_league.league.manager import LeagueManager

    cfg = _config(tmp_path, run_name, "league.main_exploiters=1")
    manager = LeagueManager(cfg, redis_url, tmp_path / run_name)
    manager.consume_results()
    _publish(redis_client, cfg, f"{run_name}:main_exploiter_0", 30)
    _add_results(redis_client, run_name, [_result("main_exploiter_0", "main", 0, 0)] * 3
                 + [_result("main_exploiter_0", "main", 0, 1)])
    manager.consume_results()
    store = LeagueStore(redis_client, run_name)
    assert store.reset_count("main_exploiter_0") == 0
    manager.snapshot_due_learners()  # 75% >= exploiter_reset_win_rate 70%
    assert "main_exploiter_0-0000030" in manager.state.snapshots()
    assert store.reset_count("main_exploiter_0") == 1
    assert manager.state.payoff.win_rate("main_exploiter_0", "main") is None  # its old results are forgotten
    assert manager.state.lineage["main_exploiter_0"] is None


def test_manager_resumes_its_state_and_drops_a_corrupt_snapshot_with_a_message(tmp_path, redis_client, redis_url,
                                                                             run_name, caplog):
    from impala_league.league.manager import LeagueManager

    cfg = _config(tmp_path, run_name)
    run_dir = tmp_path / run_name
    manager = LeagueManager(cfg, redis_url, run_dir)
    manager.consume_results()
    for version in (100, 200):
        _publish(redis_client, cfg, run_name, version, seed=version)
        manager.snapshot_due_learners()
    _add_results(redis_client, run_name, [_result("main", "main-0000100", 0, 0)] * 2)
    manager.consume_results()
    manager.save()
    redis_client.delete(*redis_client.keys(f"{run_name}:league:snap:*"))  # a fresh Redis on resume
    (run_dir / "league" / "snapshots" / "main-0000200.safetensors").write_bytes(b"garbage")
    resumed = LeagueManager(cfg, redis_url, run_dir, resume=True)
    resumed.rebalance_snapshots(fill=True)  # run's first pass, once it holds the lease
    assert resumed.state.snapshots() == ["main-0000100"]
    assert "main-0000200" in caplog.text and "leaves the league" in caplog.text
    assert resumed.state.payoff.win_rate("main", "main-0000100") == 1.0
    assert resumed.state.last_snapshot["main"] == 200
    assert LeagueStore(redis_client, run_name).has_snapshot("main-0000100")


def test_manager_refuses_an_unreadable_state_on_resume(tmp_path, redis_url, run_name):
    from impala_league.agents.checkpoint import CheckpointError
    from impala_league.league.manager import LeagueManager

    cfg = _config(tmp_path, run_name)
    state = tmp_path / run_name / "league" / "state.json"
    state.parent.mkdir(parents=True)
    state.write_text("{\"version\": 1, \"env\": \"connect_four\"}")
    with pytest.raises(CheckpointError, match="state.json"):
        LeagueManager(cfg, redis_url, tmp_path / run_name, resume=True)


def test_a_new_league_refuses_to_overwrite_a_saved_one(tmp_path, redis_url, run_name):
    from impala_league.config import ConfigError
    from impala_league.league.manager import LeagueManager

    cfg = _config(tmp_path, run_name)
    LeagueManager(cfg, redis_url, tmp_path / run_name).save()
    with pytest.raises(ConfigError, match="pass --resume"):
        LeagueManager(cfg, redis_url, tmp_path / run_name)


def test_results_are_acknowledged_only_once_saved_and_reread_after_a_crash(tmp_path, redis_client, redis_url,
                                                                           run_name):
    from impala_league.league.manager import LeagueManager

    cfg = _config(tmp_path, run_name)
    run_dir = tmp_path / run_name
    manager = LeagueManager(cfg, redis_url, run_dir)
    manager.consume_results()
    manager.save()
    _add_results(redis_client, run_name, [_result("main", "random", 0, 0)] * 3)
    assert manager.consume_results() == 3  # folded in, then the manager dies before saving
    resumed = LeagueManager(cfg, redis_url, run_dir, resume=True)
    assert resumed.state.games == 0
    assert resumed.consume_results(pending=True) == 3  # nothing lost
    resumed.save()
    assert resumed.consume_results(pending=True) == 0  # acknowledged once saved
    assert LeagueManager(cfg, redis_url, run_dir, resume=True).state.games == 3


def test_snapshots_that_redis_lost_are_put_back_and_removed_bots_leave_on_resume(tmp_path, redis_client, redis_url,
                                                                                 run_name):
    from impala_league.league.manager import LeagueManager

    cfg = _config(tmp_path, run_name, "league.bots=[random,tactical]")
    run_dir = tmp_path / run_name
    manager = LeagueManager(cfg, redis_url, run_dir)
    _publish(redis_client, cfg, run_name, 100)
    manager.snapshot_due_learners()
    store = LeagueStore(redis_client, run_name)
    redis_client.delete(store.snapshot_key("main-0000100"))
    manager.rebalance_snapshots()
    assert store.has_snapshot("main-0000100")
    manager.save()
    resumed = LeagueManager(_config(tmp_path, run_name, "league.bots=[random]"), redis_url, run_dir, resume=True)
    assert "tactical" not in resumed.state.members and "tactical" not in resumed.state.frozen()


@pytest.mark.parametrize("members", [{"x": {}}, {"main-0000100": {"kind": "snapshot"}},
                                     {"../../checkpoints/latest": {"kind": "snapshot", "player": "main"}}])
def test_malformed_members_in_the_saved_state_are_refused(tmp_path, redis_url, run_name, members):
    from impala_league.agents.checkpoint import CheckpointError
    from impala_league.league.manager import LeagueManager
    from impala_league.league.state import STATE_VERSION

    cfg = _config(tmp_path, run_name)
    state = tmp_path / run_name / "league" / "state.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"version": STATE_VERSION, "env": "tictactoe", "members": members, "payoff": [],
                                 "elo": {}}))
    with pytest.raises(CheckpointError, match="state.json"):
        LeagueManager(cfg, redis_url, tmp_path / run_name, resume=True)


def test_a_min_games_that_decay_can_never_reach_is_a_config_error():
    from impala_league.config import ConfigError

    with pytest.raises(ConfigError, match="can never be reached"):
        load_config(None, ["league.payoff_decay=0.95", "league.min_games=20"])
    load_config(None, ["league.payoff_decay=0.95", "league.min_games=10"])


def test_an_exploiter_reset_asked_for_while_its_learner_was_down_is_applied_on_resume(tmp_path, redis_client,
                                                                                      redis_url, run_name):
    from impala_league.distributed.learner.role import Learner

    cfg = _config(tmp_path, run_name, "league.main_exploiters=1")
    (tmp_path / run_name).mkdir(parents=True)
    learner = Learner(cfg, redis_url, tmp_path / run_name, player="main_exploiter_0")
    learner.checkpoint()
    LeagueStore(redis_client, run_name).request_reset("main_exploiter_0")  # while it is down
    resumed = Learner(cfg, redis_url, tmp_path / run_name, resume=True, player="main_exploiter_0")
    before = {k: v.clone() for k, v in resumed.model.state_dict().items()}
    resumed.follow_league()
    assert resumed.checkpoints.league_resets == 1
    assert any(not torch.equal(before[k], v) for k, v in resumed.model.state_dict().items())
