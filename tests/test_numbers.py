"""Numbers that mean what they say: step counters, observation scaling, weight versions, non-finite
episodes. Each test runs the real classes against the real redis-server of conftest.py."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import pytest

from impala_league.distributed.actor import Actor
from impala_league.envs.base import leader
from impala_league.envs.registry import make_env
from impala_league.checked_config import load_config
from impala_league.league.opponents import Match

DUEL = "pettingzoo:tests.duel_env"


def duel_config(run_name: str, tmp_path: Path, *extra: str):
    (tmp_path / run_name).mkdir(parents=True, exist_ok=True)
    return load_config(None, [f"run.name={run_name}", f"run.dir={tmp_path}", "run.wandb_mode=disabled",
                              f"env.name={DUEL}", "agent.torso=mlp", "agent.hidden=8", "actor.num_envs=2",
                              "actor.unroll_length=3", "learner.batch_size=2", "learner.read_block_ms=50",
                              "run.log_every_s=0.01", *extra])


def strict_lines(path: Path) -> list[dict]:
    """The JSON lines of `path`, refusing NaN and Infinity (which Python's json would accept)."""
    def refuse(constant: str):
        raise ValueError(f"{path.name} holds {constant}: not JSON")
    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def train_with_one_actor(cfg, redis_url: str, run_dir: Path):
    """Run a learner to `run.total_agent_steps` with one real actor in a thread; returns (learner, actor)."""
    from impala_league.distributed.learner.role import Learner

    learner = Learner(cfg, redis_url, run_dir)
    actor = Actor(cfg, redis_url, 0)
    thread = threading.Thread(target=actor.run, daemon=True)
    thread.start()
    try:
        learner.run()
    finally:
        actor.stop()
        thread.join(30)
        actor.close()
    return learner, actor


# -- 4. a NaN reward decides nothing -------------------------------------------------------------

def test_leader_picks_no_winner_from_a_nan_score():
    assert leader([1.0, float("nan")]) is None
    assert leader([float("nan"), 1.0]) is None
    assert leader([2.0, 1.0]) == 0 and leader([1.0, 1.0]) is None
    env = make_env(DUEL, 0, {"rounds": 1, "nan_every": 1})
    env.advance()
    env.act([1, 1])  # matching: player_0 scores 1, player_1's reward is NaN
    (episode,) = env.advance().episodes
    assert episode.returns[0] == 1.0 and math.isnan(episode.returns[1])
    assert episode.winner is None  # not player_0 by seat order


def test_a_nan_episode_is_counted_and_kept_out_of_the_statistics(tmp_path, redis_url, run_name, monkeypatch):
    monkeypatch.setattr("impala_league.distributed.actor.RESULTS_EVERY_S", 0.0)  # results reach the learner's first logs
    # Every second episode ends with a NaN reward: its unroll is dead-lettered, its result counted apart.
    cfg = duel_config(run_name, tmp_path, "env.kwargs.nan_every=2", "run.total_agent_steps=24")
    train_with_one_actor(cfg, redis_url, tmp_path / run_name)
    records = strict_lines(tmp_path / run_name / "metrics.jsonl")
    assert sum(r["nonfinite_episodes"] for r in records) >= 1
    assert sum(r["dead_letters"] for r in records[-1:]) >= 1
    returns = [r["episode_return"] for r in records if "episode_return" in r]
    assert returns and all(math.isfinite(x) for x in returns)


def test_the_league_scores_no_game_with_a_nan_return(tmp_path, redis_url, run_name):
    from impala_league.distributed.wire.transport import ResultsStream
    from impala_league.envs.base import EpisodeResult
    from impala_league.league.manager import LeagueManager

    cfg = load_config(None, [f"run.name={run_name}", f"run.dir={tmp_path}", "env.name=tictactoe", "agent.torso=mlp",
                             "agent.hidden=8", "actor.num_envs=1", "league.enabled=true", "league.bots=[random]"])
    manager = LeagueManager(cfg, redis_url, tmp_path / run_name)
    manager.consume_results()  # creates the group at the stream's end
    actor = Actor(cfg, redis_url, 0)
    try:
        actor.slots[0].match = Match("random", None, "random", learner_seat=0)
        nan = float("nan")
        reports = [actor.result(0, EpisodeResult((nan, -1.0), 5, leader([nan, -1.0]))),
                   actor.result(0, EpisodeResult((1.0, -1.0), 5, 0))]
    finally:
        actor.close()
    assert reports[0]["nonfinite"] and reports[0]["winner"] == -1 and reports[0]["returns"] == []
    ResultsStream(manager.redis, run_name).add_many(reports)
    assert manager.consume_results() == 1  # the finite game alone
    record = manager.payoff.records[("main", "random")]
    assert (record.wins, record.draws, record.losses) == (1, 0, 0)  # the NaN game is no draw


# -- 2. uint8 means an image only when the space says 0..255 ---------------------------------------

PLANES = "pettingzoo:tests.planes_env"


def first_layer_input(kwargs: dict) -> "torch.Tensor":
    """What the first layer of the network `make_model` builds for PLANES(kwargs) reads from one
    observation the real adapter encodes."""
    import torch

    from impala_league.agents.model import make_model
    from impala_league.envs.registry import env_spec

    spec = env_spec(PLANES, kwargs)
    cfg = load_config(None, [f"env.name={PLANES}", "agent.torso=mlp", "agent.hidden=8"])
    model = make_model(spec, cfg.agent)
    step = make_env(PLANES, 0, kwargs).advance()
    seen = []
    model.torso.fc[0].register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    model(torch.from_numpy(step.observations[0][None]), torch.from_numpy(step.action_masks[0][None]))
    return seen[0]


def test_uint8_planes_reach_the_network_as_they_are_and_images_are_scaled():
    from impala_league.envs.registry import env_spec

    assert not env_spec(PLANES, {"high": 1}).obs_image
    assert first_layer_input({"high": 1, "value": 1}).tolist() == [[1.0, 1.0, 1.0, 1.0]]  # not 1/255
    assert first_layer_input({"high": 10, "value": 7}).tolist() == [[7.0] * 4]
    assert env_spec(PLANES, {"high": 255}).obs_image
    assert first_layer_input({"high": 255, "value": 255}).tolist() == [[1.0] * 4]
    assert first_layer_input({"high": 255, "value": 51})[0].tolist() == pytest.approx([0.2] * 4)


@pytest.mark.parametrize("value", [-1, 11])
def test_an_observation_outside_its_bounds_is_refused_not_wrapped(value):
    env = make_env(PLANES, 0, {"high": 10, "value": value})
    with pytest.raises(ValueError, match=rf"env '{PLANES}', agent 'agent': observation value {value} at index "
                                         r"\(0, 0, 0\) is outside the space's bounds \[0, 10\] \(uint8\)"):
        env.advance()


# -- 3. a version names one set of weights; an unroll carries the oldest version that acted in it ----

def tictactoe_config(run_name: str, tmp_path: Path, *extra: str):
    return load_config(None, [f"run.name={run_name}", f"run.dir={tmp_path}", "run.wandb_mode=disabled",
                              "env.name=tictactoe", "agent.torso=mlp", "agent.hidden=8", "actor.num_envs=1",
                              "actor.unroll_length=3", *extra])


def weights_of(model) -> list:
    return [p.detach().clone() for p in model.parameters()]


def test_an_actor_reloads_when_a_rolled_back_learner_reuses_a_version_number(tmp_path, redis_client, redis_url,
                                                                             run_name):
    import torch

    from impala_league.agents.model import make_model
    from impala_league.distributed.wire.params import ParamStore
    from impala_league.envs.registry import env_spec

    cfg = tictactoe_config(run_name, tmp_path)
    store = ParamStore(redis_client, run_name)
    before, checkpoint, after = (make_model(env_spec("tictactoe"), cfg.agent) for _ in range(3))
    store.publish(before.state_dict(), 5)  # the learner's last publish before it died
    actor = Actor(cfg, redis_url, 0)
    try:
        actor.sync_params(wait=True)
        assert actor.policy.version == 5
        # Resumed from its checkpoint at update 3, the learner publishes 3, then 4, 5 again with new weights.
        store.publish(checkpoint.state_dict(), 3)
        store.publish(after.state_dict(), 5)
        actor.sync_params()
        assert actor.policy.version == 5
        for held, published in zip(weights_of(actor.policy.model), weights_of(after)):
            assert torch.equal(held, published)  # not the pre-crash weights of version 5
    finally:
        actor.close()


def test_unrolls_from_before_a_rollback_are_counted_apart_from_lag_zero():
    from impala_league.distributed.learner.metrics import MetricsWindow

    window = MetricsWindow(0.0)
    stats = {"loss": 1.0, "skipped_update": 0.0}
    window.add(24, [-2, 0, 1, 1], stats)  # learner at update 10: one unroll of version 12 from before a rollback
    record = window.summary(1.0)
    assert record["policy_lag_negative"] == 1
    assert record["policy_lag_counts"] == [1, 2] and record["policy_lag"] == pytest.approx(2 / 3)
    assert record["policy_lag_max"] == 1
    only_ahead = MetricsWindow(0.0)
    only_ahead.add(6, [-1], stats)
    record = only_ahead.summary(1.0)
    assert record["policy_lag_negative"] == 1 and record["policy_lag_counts"] == []
    from impala_league.tracking import strict_json
    assert json.loads(strict_json(record))["policy_lag"] is None


def test_an_unroll_is_stamped_with_the_version_that_chose_its_first_action(tmp_path, redis_client, redis_url,
                                                                          run_name):
    import itertools

    import msgpack

    from impala_league.agents.model import make_model
    from impala_league.distributed.wire.params import ParamStore
    from impala_league.envs.registry import env_spec

    T = 3
    cfg = tictactoe_config(run_name, tmp_path, "actor.param_sync_every=1", "actor.send_batch=1")
    store = ParamStore(redis_client, run_name)
    model = make_model(env_spec("tictactoe"), cfg.agent)
    store.publish(model.state_dict(), 1)
    actor = Actor(cfg, redis_url, 0)
    # A new version after every unroll sent: the two seats' unrolls end at different moves, so one
    # seat's unroll is still open while the other's send loads the next version.
    versions = itertools.count(2)
    sync, choose, send = actor.sync_params, actor.choose_actions, actor.send
    moves: list[tuple[int, int]] = []  # (seat, version that chose the move): one acting agent per step

    def publishing_sync(wait: bool = False) -> None:
        if not wait:
            store.publish(model.state_dict(), next(versions))
        sync(wait)

    def logging_choose(steps):
        moves.append((steps[0].agents[0], actor.policy.version))
        return choose(steps)

    actor.sync_params, actor.choose_actions = publishing_sync, logging_choose
    actor.send = lambda unrolls, versions=None: send(unrolls, versions) or actor.counters.sent >= 12
    try:
        actor.run()
    finally:
        actor.close()
    # Unroll k of a seat: its moves kT..kT+T-1, finished when the seat observes move (k+1)T.
    expected = []  # (move index at which it finished, version of its first move)
    for seat in (0, 1):
        at = [n for n, (s, _) in enumerate(moves) if s == seat]
        expected += [(at[(k + 1) * T], moves[at[k * T]][1]) for k in range(len(at) // T) if (k + 1) * T < len(at)]
    stamped = [msgpack.unpackb(f[b"data"])["header"]["policy_version"]
               for _, f in redis_client.xrange(f"{run_name}:traj")]
    # The last unroll sent ends the run before its seat's next move is chosen: it is not in `expected`.
    assert len(stamped) == 12 and len(expected) >= 11
    assert stamped[:len(expected)] == [version for _, version in sorted(expected)]
    assert len(set(stamped)) > 1


# -- 1. agent steps trained and env steps played are separate counts ------------------------------

def test_metrics_count_agent_steps_trained_and_env_steps_played_apart(tmp_path, redis_client, redis_url, run_name):
    from impala_league.distributed.wire.transport import TrajectoryStream

    # Self-play duel: both players learn, so each env step is two agent steps (one per player).
    cfg = duel_config(run_name, tmp_path, "run.total_agent_steps=24")
    learner, actor = train_with_one_actor(cfg, redis_url, tmp_path / run_name)
    records = strict_lines(tmp_path / run_name / "metrics.jsonl")
    assert all("agent_steps_trained" in r and "frames" not in r for r in records)  # one name, the new one
    assert records[-1]["agent_steps_trained"] == learner.agent_steps == 24  # the budget counts agent steps
    counts = TrajectoryStream(redis_client, run_name).accounting()
    played, T, buffers = counts["env_steps"], cfg.actor.unroll_length, 2 * cfg.actor.num_envs
    # What the actor reported with its last send: each env step once, both players' steps in its unrolls.
    assert 0 < played <= actor.counters.env_steps
    assert counts["produced"] * T <= 2 * played <= (counts["produced"] + buffers) * T
    assert 12 <= records[-1]["env_steps_played"] <= played  # 24 agent steps trained took >= 12 env steps
