"""The league's state and rules (league/state.py) without Redis: results scored, snapshots due, resets,
opponent distributions computed by hand, and state.json's league part read back as it was written."""

from __future__ import annotations

import copy
import json
import math

import pytest

from impala_league.config import LeagueConfig
from impala_league.league.state import STATE_VERSION, LeagueState, Member, single_opponent, snapshot_id

LEARNERS = ["main", "main_exploiter_0", "league_exploiter_0"]


def _state(*learners: str, **league) -> LeagueState:
    settings = {"min_games": 1, "payoff_decay": 1.0, "bots": ["random"], "snapshot_every": 100, **league}
    return LeagueState(LeagueConfig(**settings), list(learners or ["main"]), "tictactoe", seats=2, seed=0)


def _result(player: str, opponent: str, won: bool, seat: int = 0) -> dict:
    """A result as an actor reports it, the opponent pinned (a learner at version 7)."""
    version = f"{opponent}@7" if opponent in LEARNERS else opponent
    return {"player": player, "opponent_id": opponent, "opponent_version": version, "learner_seat": seat,
            "winner": seat if won else 1 - seat, "length": 5, "returns": [0.0, 0.0]}


def _games(player: str, opponent: str, wins: int, losses: int) -> list[dict]:
    return [_result(player, opponent, True, k % 2) for k in range(wins)] + [
        _result(player, opponent, False, k % 2) for k in range(losses)]


def _snapshot(state: LeagueState, player: str, step: int, created: float = 0.0) -> Member:
    member = state.new_snapshot(player, step, agent_steps=10 * step, created=created)
    state.add_snapshot(member)
    return member


# -- results -------------------------------------------------------------------------------------------


def test_score_counts_pinned_league_games_and_skips_the_rest():
    state = _state()
    _snapshot(state, "main", 100)
    unpinned = {**_result("main", "main-0000100", True), "opponent_version": "main-0000200"}
    nan = {**_result("main", "random", True), "nonfinite": True}
    outside = _result("main", "random", True, seat=5)  # a seat the env has not: pooled counts only
    results = [_result("main", "random", True), _result("main", "random", False, 1), _result("main", "self", True),
               _result("main", "nobody", True), unpinned, nan, outside, _result("main", "main-0000100", False)]
    assert state.score(results, unreadable=2, evicted={"main-0000100"}) == 4
    record = state.payoff.records[("main", "random")]
    assert (record.wins, record.draws, record.losses) == (2, 0, 1)
    assert state.payoff.win_rate("main", "random", seat=0) == 1.0  # one win as seat 0, none from seat 5
    assert state.payoff.seats == {0, 1}
    assert (state.games, state.skipped, state.evicted_games) == (4, 3 + 2, 1)  # nobody, unpinned, nan; unreadable
    # Elo is zero-sum: the snapshot started at main's 0 (copied when it joined), and every game moves
    # both players by the same K (S - E). Hand-computed values: test_ratings_record_rounds_to_a_tenth.
    assert sum(r.elo for r in state.elo.ratings.values()) == pytest.approx(0.0, abs=1e-9)
    assert state.elo.get("main").information > state.elo.get("main-0000100").information > 0


def test_single_opponent_needs_the_exact_version():
    assert single_opponent({"opponent_id": "main", "opponent_version": "main@12"})
    assert single_opponent({"opponent_id": "main-0000100", "opponent_version": "main-0000100"})
    assert not single_opponent({"opponent_id": "main", "opponent_version": "main"})
    assert not single_opponent({"opponent_id": "main-0000100"})


# -- snapshots and resets ------------------------------------------------------------------------------


def test_main_is_due_every_snapshot_every_updates_and_its_snapshots_chain():
    state = _state()
    assert state.due_snapshot("main", 99) is None
    assert state.due_snapshot("main", 100) == "100 updates since the last snapshot"
    first = _snapshot(state, "main", 100)
    assert (first.id, first.parent, first.agent_steps, state.last_snapshot["main"]) == ("main-0000100", None, 1000, 100)
    assert state.due_snapshot("main", 100) is None and state.due_snapshot("main", 199) is None
    assert state.due_snapshot("main", 200) == "100 updates since the last snapshot"
    second = _snapshot(state, "main", 200)
    assert second.parent == "main-0000100" and state.lineage["main"] == "main-0000200"
    assert state.new_snapshot("main", 200, 0, 0.0) is None  # exists already
    assert state.snapshots() == ["main-0000100", "main-0000200"] and state.frozen() == ["random", *state.snapshots()]


def test_exploiters_are_due_at_twice_the_period_or_when_they_win():
    state = _state(*LEARNERS)
    assert state.due_snapshot("main_exploiter_0", 199) is None
    assert state.due_snapshot("main_exploiter_0", 200) == "200 updates since the last snapshot"
    state.score(_games("main_exploiter_0", "main", 3, 1))  # 75% >= exploiter_reset_win_rate 70%
    assert state.due_snapshot("main_exploiter_0", 50) == "beats the main agent 75%"
    state.score(_games("league_exploiter_0", "random", 7, 3))  # 70% against the whole frozen league
    assert state.due_snapshot("league_exploiter_0", 50) == "beats all 1 league members at >= 70%"
    _snapshot(state, "main", 100)  # a member it has not played: no longer beats everyone
    assert state.due_snapshot("league_exploiter_0", 50) is None


def test_resets_follow_the_roles_and_forget_the_learner():
    never = _state(*LEARNERS, league_exploiter_reset_prob=0.0)
    always = _state(*LEARNERS, league_exploiter_reset_prob=1.0)
    assert not never.resets_after_snapshot("main") and never.resets_after_snapshot("main_exploiter_0")
    assert not never.resets_after_snapshot("league_exploiter_0") and always.resets_after_snapshot("league_exploiter_0")
    state = _state(*LEARNERS)
    state.score(_games("main_exploiter_0", "main", 3, 1))
    _snapshot(state, "main_exploiter_0", 30)
    state.reset("main_exploiter_0", 30)
    assert state.payoff.win_rate("main_exploiter_0", "main") is None and "main_exploiter_0" not in state.elo.ratings
    assert state.lineage["main_exploiter_0"] is None and state.due_snapshot("main_exploiter_0", 229) is None
    assert _snapshot(state, "main_exploiter_0", 230).parent is None


def test_add_snapshot_refuses_strangers_and_an_older_file_keeps_the_latest():
    state = _state()
    _snapshot(state, "main", 200)
    _snapshot(state, "main", 100)  # adopted from a file after a crash: older than the latest
    assert state.lineage["main"] == "main-0000200" and state.last_snapshot["main"] == 200
    with pytest.raises(ValueError, match="no snapshot of a learner"):
        state.add_snapshot(Member("main_exploiter_0-0000100", "snapshot", "main_exploiter", "main_exploiter_0", 100))
    with pytest.raises(ValueError, match="already"):
        state.add_snapshot(Member("main-0000100", "snapshot", "main", "main", 100))


# -- opponent distributions ----------------------------------------------------------------------------


def test_main_agent_distribution_matches_hand_computation():
    # main vs main-0000100 1-3 (x = 0.25: forgotten, below 0.3), vs random 3-1 (x = 0.75).
    state = _state()
    _snapshot(state, "main", 100)
    state.score(_games("main", "main-0000100", 1, 3) + _games("main", "random", 3, 1))
    # Hard PFSP (p = 2) over [random, main-0000100]: 0.0625 and 0.5625 (total 0.625) of the 0.5 share;
    # the forgotten share 0.15 all to main-0000100; self-play 0.35.
    dist = state.update_distributions()["main"]
    assert dist == pytest.approx({"self": 0.35, "random": 0.05, "main-0000100": 0.45 + 0.15}, abs=1e-12)
    assert state.distributions["main"] is dist


def test_exploiter_distributions_and_residency_inputs():
    state = _state(*LEARNERS)
    assert state.distribution("main_exploiter_0") == {"main": 1.0}
    assert state.distribution("league_exploiter_0") == {"random": 1.0}
    _snapshot(state, "main", 100, created=1.0)
    _snapshot(state, "main", 200, created=2.0)
    _snapshot(state, "league_exploiter_0", 200, created=3.0)
    state.distributions = {"main": {"self": 0.5, "main-0000100": 0.5},
                           "league_exploiter_0": {"main-0000100": 0.25, "league_exploiter_0-0000200": 0.75}}
    created, newest, weights = state.residency_inputs()
    assert created == {"main-0000100": 1.0, "main-0000200": 2.0, "league_exploiter_0-0000200": 3.0}
    assert newest == ["main-0000200", "league_exploiter_0-0000200"]
    assert weights == {"main-0000100": 0.75, "league_exploiter_0-0000200": 0.75}


# -- what is persisted ---------------------------------------------------------------------------------

OLD_SNAPSHOT = {"kind": "snapshot", "id": "main-0000100", "player": "main", "role": "main", "step": 100,
                "agent_steps_trained": 1234, "parent": None, "created": 1700000000.5}
"""A snapshot as state.json and the snapshot file's meta held it before members were records."""


def test_a_member_round_trips_through_json_in_the_format_already_on_disk():
    member = Member.from_json("main-0000100", json.loads(json.dumps(OLD_SNAPSHOT)))
    assert (member.player, member.step, member.agent_steps, member.created) == ("main", 100, 1234, 1700000000.5)
    assert member.to_json() == OLD_SNAPSHOT and list(member.to_json()) == list(OLD_SNAPSHOT)
    assert Member("main_exploiter_0", "learner", "main_exploiter").to_json() == {"kind": "learner",
                                                                                "role": "main_exploiter"}
    assert Member.from_json("random", {"kind": "bot"}).to_json() == {"kind": "bot"}
    for bad in ({}, {"kind": "snapshot"}, {"kind": "snapshot", "player": "main"}, {"kind": "ghost"}):
        with pytest.raises(ValueError):
            Member.from_json("main-0000100", bad)
    with pytest.raises(ValueError, match="malformed id"):
        Member.from_json("../../checkpoints/latest", {**OLD_SNAPSHOT, "id": "../../checkpoints/latest"})


def _played_state() -> LeagueState:
    state = _state(*LEARNERS, payoff_decay=0.9, bots=["random", "tactical"])
    _snapshot(state, "main", 100, created=5.0)
    state.score(_games("main", "main-0000100", 2, 3) + _games("main", "tactical", 4, 1)
                + _games("league_exploiter_0", "random", 1, 1) + [{**_result("main", "random", True), "winner": -1}])
    state.update_distributions()
    return state


def test_the_state_round_trips_through_json_and_a_removed_bot_leaves():
    state = _played_state()
    saved = json.loads(json.dumps(state.to_json()))
    assert saved["version"] == STATE_VERSION and saved["members"]["main-0000100"]["parent"] is None
    again = _state(*LEARNERS, payoff_decay=0.9, bots=["random", "tactical"])
    again.restore(saved)
    assert json.loads(json.dumps(again.to_json())) == {**saved, "skipped_results": 0}  # skipped is per process
    assert again.payoff.win_rate("main", "main-0000100") == state.payoff.win_rate("main", "main-0000100")
    assert again.members["main-0000100"] == state.members["main-0000100"]
    fewer = _state(*LEARNERS, payoff_decay=0.9, bots=["random"])
    fewer.restore(saved)
    assert "tactical" not in fewer.members and fewer.payoff.games("main", "tactical") == 0
    assert "tactical" not in fewer.elo.ratings


@pytest.mark.parametrize("change", [
    lambda s: s.update(env="connect_four"), lambda s: s.update(version=STATE_VERSION + 1), lambda s: s.pop("payoff"),
    lambda s: s["payoff"][0].__setitem__(2, -1.0), lambda s: s["elo"]["main"].__setitem__(0, math.inf),
    lambda s: s["members"].update({"x": {}})])
def test_restore_refuses_a_malformed_state_and_changes_nothing(change):
    saved = json.loads(json.dumps(_played_state().to_json()))
    change(saved)
    fresh = _state(*LEARNERS, payoff_decay=0.9, bots=["random", "tactical"])
    before = copy.deepcopy(fresh.to_json())
    with pytest.raises(ValueError):
        fresh.restore(saved)
    assert fresh.to_json() == before


def test_ratings_record_rounds_to_a_tenth():
    state = _state()
    state.score(_games("main", "random", 1, 0))  # K = 8, E = 1/2: main +4, random -4
    assert state.ratings_record(12.5) == {"time": 12.5, "games": 1, "elo": {"main": 4.0, "random": -4.0}}
    assert snapshot_id("main", 12345678) == "main-12345678"
