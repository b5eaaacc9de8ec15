"""Seats of simultaneous-move envs: `player_<n>` agents are separate players (a custom duel, PettingZoo's
rps_v2), `<team>_<n>` units share a team, names that cannot tell are guessed with a warning, and
`env.seats` declares them."""

from __future__ import annotations

import logging

import pytest

from impala_league.agents.network import ActorCritic
from impala_league.config import ConfigError
from impala_league.distributed.actor import Actor
from impala_league.distributed.wire.params import ParamStore
from impala_league.envs.registry import env_spec, make_env
from impala_league.checked_config import load_config

DUEL = "pettingzoo:tests.duel_env"
RPS = "pettingzoo:pettingzoo.classic.rps_v2"


def _play(env, actions_by_agent: dict[str, int]):
    """One episode with fixed actions per agent name; returns its EpisodeResult."""
    while True:
        step = env.advance()
        if step.episodes:
            return step.episodes[0]
        env.act([actions_by_agent[env.agents[i]] for i in step.agents])


def test_a_custom_duel_with_player_agents_has_two_seats_and_a_winner():
    spec = env_spec(DUEL)
    assert spec.kind == "parallel"
    assert spec.seats == ("player_0", "player_1") and spec.agent_seats == (0, 1)
    result = _play(make_env(DUEL, 0), {"player_0": 1, "player_1": 1})  # matching: player_0 scores every round
    assert result.returns == (3.0, -3.0) and result.winner == 0
    result = _play(make_env(DUEL, 0), {"player_0": 0, "player_1": 1})
    assert result.returns == (-3.0, 3.0) and result.winner == 1


def test_pettingzoo_rps_has_two_seats():
    spec = env_spec(RPS)
    assert spec.seats == ("player_0", "player_1") and spec.agent_seats == (0, 1)
    result = _play(make_env(RPS, 0), {"player_0": 1, "player_1": 0})  # paper beats rock, every round
    assert result.returns[0] > 0 > result.returns[1] and result.winner == 0


def test_teams_still_share_their_seat():
    spec = env_spec("mpe:simple_tag")
    assert spec.seats == ("adversary", "agent") and spec.agent_seats == (0, 0, 0, 1)


def test_an_ambiguous_guess_warns_and_declared_seats_settle_it(caplog):
    kwargs = {"names": ["agent_0", "agent_1"]}
    with caplog.at_level(logging.WARNING, logger="envs"):
        spec = env_spec(DUEL, kwargs)
    assert spec.seats == ("agent",) and spec.agent_seats == (0, 0)
    assert any("agents agent_0, agent_1 are taken as one team 'agent'" in r.message
               and "env.seats: [['agent_0'], ['agent_1']]" in r.message for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="envs"):
        declared = env_spec(DUEL, kwargs, [["agent_1"], ["agent_0"]])
    assert declared.seats == ("agent_1", "agent_0") and declared.agent_seats == (1, 0)
    assert not caplog.records
    result = _play(make_env(DUEL, 0, kwargs, seats=[["agent_1"], ["agent_0"]]), {"agent_0": 1, "agent_1": 1})
    assert result.returns == (-3.0, 3.0) and result.winner == 1  # seat 0 is agent_1, who lost every round


def test_env_seats_in_the_config_is_checked_and_reaches_the_actor(tmp_path, redis_url, redis_client, run_name):
    base = [f"run.name={run_name}", f"run.dir={tmp_path}", f"env.name={DUEL}", "env.kwargs.names=[red_0,red_1]",
            "agent.torso=mlp", "agent.hidden=8", "actor.num_envs=4", "actor.unroll_length=3"]
    assert env_spec(DUEL, {"names": ["red_0", "red_1"]}).seats == ("red",)
    with pytest.raises(ConfigError, match=r"env.seats \[\['red_0'\]\] must put each of its agents \['red_0', "
                                          r"'red_1'\] in exactly one seat \(agents in no seat \['red_1'\]\)"):
        load_config(None, [*base, "env.seats=[[red_0]]"])
    with pytest.raises(ConfigError, match="env.seats is for simultaneous-move"):
        load_config(None, ["env.name=tictactoe", "env.seats=[[player_1],[player_2]]"])
    cfg = load_config(None, [*base, "env.seats=[[red_0],[red_1]]"])
    spec = env_spec(DUEL, cfg.env.kwargs, cfg.env.seats)
    ParamStore(redis_client, run_name).publish(ActorCritic(spec.obs_shape, spec.num_actions, cfg.agent).state_dict(), 1)
    actor = Actor(cfg, redis_url, 0)
    results = []
    actor.send = lambda batch, *_: len(results) >= 20
    actor.link.results.add_many = results.extend
    try:
        actor.run()
    finally:
        actor.close()
    assert actor.spec.seats == ("red_0", "red_1")
    # Two seats: each episode has a winner and opposite returns (one team of two would score 0 always).
    assert all(len(r["returns"]) == 2 and r["returns"][0] == -r["returns"][1] != 0 for r in results)
    assert {r["winner"] for r in results} <= {0, 1}


def test_declared_seats_are_kept_in_replays(tmp_path):
    from impala_league.evaluation.evaluate import play_games
    from impala_league.evaluation.bots import make_bot
    from impala_league.evaluation.replays import load_replay, save_match, simulate

    kwargs, seats = {"names": ["agent_0", "agent_1"]}, [["agent_1"], ["agent_0"]]
    sides = (make_bot("random", DUEL, seed=1), make_bot("random", DUEL, seed=2))
    records = play_games(DUEL, sides, 4, seed=5, kwargs=kwargs, seats=seats)
    paths = save_match(tmp_path, DUEL, ("a", "b"), records, kwargs, seats)
    for path, record in zip(paths, records):
        replay = load_replay(path)
        assert replay.env_seats == seats and replay.seats == ["agent_1", "agent_0"]
        simulate(replay, path)  # re-played with the declared seats: returns and winner match
        assert replay.rewards == list(record.returns) and replay.rewards[0] == -replay.rewards[1] != 0
    inferred = save_match(tmp_path / "inferred", DUEL, ("a",), play_games(DUEL, sides[:1], 1, kwargs=kwargs),
                          kwargs)
    assert "env_seats" not in inferred[0].read_text()  # files without declared seats stay as they were


def _duel_checkpoint(path, seats):
    from impala_league.agents.checkpoint import save_checkpoint
    from impala_league.config import to_yaml

    cfg = load_config(None, [f"env.name={DUEL}", "env.kwargs.names=[agent_0,agent_1]", "agent.torso=mlp",
                             "agent.hidden=8", *([f"env.seats={seats}"] if seats else [])])
    spec = env_spec(DUEL, cfg.env.kwargs, cfg.env.seats)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_checkpoint(path, ActorCritic(spec.obs_shape, spec.num_actions, cfg.agent), None, to_yaml(cfg),
                    {"step": 1, "agent_steps_trained": 1})
    return path


def test_a_tournament_plays_the_checkpoints_declared_seats(tmp_path):
    from impala_league.evaluation.tournament import PlayerError, resolve_players, round_robin

    a = _duel_checkpoint(tmp_path / "a.safetensors", "[[agent_0],[agent_1]]")
    env_name, players = resolve_players([str(a), "random"])
    assert players[0].seats == [["agent_0"], ["agent_1"]]
    for workers in (1, 2):  # in this process, and in worker processes given the seats on their command line
        result = round_robin(env_name, players, games=3, workers=workers, record_dir=str(tmp_path / f"r{workers}"))
        assert len(result["matches"]) == 2
        # Two seats: every game has a winner (3 rounds of matching pennies never tie).
        assert all(m["draws"] == 0 and m["first_wins"] + m["second_wins"] == 3 for m in result["matches"])
    b = _duel_checkpoint(tmp_path / "b.safetensors", None)
    with pytest.raises(PlayerError, match="was trained with env.seats"):
        resolve_players([str(a), str(b)])
