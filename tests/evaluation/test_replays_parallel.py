"""Replays of simultaneous-move games (MAgent2 battle, MPE) and one-agent gymnasium envs: recording,
re-simulation through the adapter, tampering, terminal summaries and GIFs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import impala_league.evaluation.replays as replays
import run
from impala_league.agents.network import ActorCritic
from impala_league.config import load_config, to_yaml
from impala_league.agents.checkpoint import save_checkpoint
from impala_league.envs.registry import env_spec
from impala_league.evaluation.evaluate import play_games
from impala_league.evaluation.replays import ReplayError, load_replay, save_match, simulate
from impala_league.evaluation.tournament import _worker_main
from tests.evaluation.test_replays import tampered

BATTLE = {"map_size": 12, "max_cycles": 150}  # two units per team; random-ish play lasts the 150 steps
MOVES = 13  # battle actions 0-12 move, 13-20 attack a neighbouring cell


class Aggressor:
    """A battle bot that attacks a random neighbouring cell with probability `p` while an enemy is next
    to it, else moves at random."""

    def __init__(self, seed: int, p: float):
        self.rng, self.p = np.random.default_rng(seed), p

    def act(self, observation: np.ndarray, mask: np.ndarray) -> int:
        if observation[5:8, 5:8, 3].any() and self.rng.random() < self.p:  # the unit sits at (6, 6); channel 3: enemies
            return int(self.rng.integers(MOVES, 21))
        return int(self.rng.integers(0, MOVES))

    def act_batch(self, observations: np.ndarray, masks: np.ndarray) -> np.ndarray:
        return np.array([self.act(o, m) for o, m in zip(observations, masks)])


@pytest.fixture(scope="module")
def battles(tmp_path_factory) -> list[Path]:
    """Two recorded battles: in game 0 (seed 0) red kills a blue unit and wins on units left; game 1 is a draw."""
    records = play_games("battle", (Aggressor(1, 1.0), Aggressor(101, 0.3)), 2, 0, True, BATTLE)
    assert [r.winner for r in records] == [0, None] and [r.length for r in records] == [150, 150]
    return save_match(tmp_path_factory.mktemp("battles"), "battle", ("aggressor", "timid"), records, BATTLE)


def write_checkpoint(path: Path, env: str, kwargs: dict) -> Path:
    """A randomly initialised MLP policy of `env` built with `kwargs`, in the learner's checkpoint format."""
    overrides = [f"env.name={env}", "agent.torso=mlp", "agent.hidden=16", "agent.mlp_layers=1"]
    cfg = load_config(None, overrides + [f"env.kwargs.{k}={v}" for k, v in kwargs.items()])
    spec = env_spec(env, kwargs)
    torch.manual_seed(0)
    save_checkpoint(path, ActorCritic(spec.obs_shape, spec.num_actions, cfg.agent), None, to_yaml(cfg),
                    {"step": 10, "agent_steps_trained": 320})
    return path


def test_a_battle_re_simulates_to_its_recorded_outcome(battles):
    won, draw = (load_replay(p) for p in battles)
    assert won.format == 2 and won.kwargs == BATTLE and won.seats == ["red", "blue"]
    assert won.players == ["aggressor", "timid"] and won.env_version == "battle_v4"
    for path, replay in zip(battles[::-1], (draw, won)):
        positions = simulate(replay, path)
        assert len(positions) == replay.length + 1 == 151
        assert positions[0].units == (2, 2) and positions[0].returns == (0.0, 0.0)
        # Every step's actions are one per living unit: the units alive before each step sum to the actions.
        assert sum(sum(p.units) for p in positions[:-1]) == len(replay.actions)
        assert np.allclose(positions[-1].returns, replay.rewards)
    assert positions[-1].units[0] > positions[-1].units[1]  # red wins by units left
    assert draw.winner is None and won.winner == 0


def test_tampered_battles_are_refused_with_the_reason(battles, tmp_path):
    source = battles[0]
    data = json.loads(source.read_text())
    actions = data["actions"]
    attack_first = [MOVES if actions[0] < MOVES else 0, *actions[1:]]  # an attack costs a reward penalty
    cases = {
        "action.json": (dict(actions=attack_first), r"re-simulated rewards .* differ from the recorded"),
        "illegal.json": (dict(actions=[21, *actions[1:]]), r"action 1 \(21, by red_0 at step 1\) is illegal there"),
        "reward.json": (dict(rewards=[data["rewards"][0] + 1.0, data["rewards"][1]]), r"re-simulated rewards"),
        "winner.json": (dict(winner=1), r"re-simulated outcome \(red \(aggressor\) won\) differs from the "
                                        r"recorded one \(blue \(timid\) won\)"),
        "cycles.json": (dict(kwargs={**BATTLE, "max_cycles": 149}),
                        r"the game ended after 149 steps \(\d+ actions\) but \d+ actions are recorded"),
        "map.json": (dict(kwargs={**BATTLE, "map_size": 14}), r"the game is not over after the \d+ recorded actions"),
        "kwarg.json": (dict(kwargs={"no_such_option": 1}), r"env 'battle' does not accept env\.kwargs"),
        "tiny.json": (dict(kwargs={**BATTLE, "map_size": 5}), r"env 'battle' refuses env\.kwargs .*: size of map must "
                                                              r"be at least 12"),
        "short.json": (dict(actions=actions[:-4]),
                       r"the game is not over after the \d+ recorded actions \(step 149 needs 3, 2 are left\)"),
        "length.json": (dict(length=149), r"the game lasted 150 steps but 'length' is 149"),
    }
    for name, (change, message) in cases.items():
        path = tampered(source, tmp_path / name, **change)
        with pytest.raises(ReplayError, match=name.replace(".", r"\.") + ": " + message):
            simulate(load_replay(path), path)
    with pytest.raises(ReplayError, match=r"kwargs\.json: field 'kwargs' is missing or not a dict"):
        load_replay(tampered(source, tmp_path / "kwargs.json", kwargs=[12]))


def test_format_1_replays_are_still_read_with_the_default_env(battles, tmp_path):
    from impala_league.evaluation.bots import make_bot

    records = play_games("tictactoe", (make_bot("tactical", "tictactoe", 0), make_bot("random", "tictactoe", 1)), 1)
    path = save_match(tmp_path, "tictactoe", ("tactical", "random"), records)[0]
    data = json.loads(path.read_text())
    del data["kwargs"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps({**data, "format": 1}))
    replay = load_replay(old)
    assert replay.format == 1 and replay.kwargs == {}
    assert len(simulate(replay, old)) == replay.length + 1
    with pytest.raises(ReplayError, match=r"old_kwargs\.json: unknown fields \['kwargs'\]"):
        load_replay(tampered(old, tmp_path / "old_kwargs.json", kwargs={}))
    with pytest.raises(ReplayError, match=r"new\.json: replay format 3; this build reads formats 1, 2"):
        load_replay(tampered(old, tmp_path / "new.json", format=3))


def test_battle_gif_shows_every_step_and_the_replay_command_prints_units_per_step(battles, tmp_path, capsys):
    path = battles[0]
    replay = load_replay(path)
    gif = tmp_path / "battle.gif"
    assert run.main(["replay", str(path), "--gif", str(gif)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "step 0/150: red (aggressor) 2 units, return 0.00 | blue (timid) 2 units, return 0.00"
    assert len(out) == 151 + 2 and out[150].startswith("step 150/150: red (aggressor) 2 units")
    assert out[-2].startswith("battle {'map_size': 12, 'max_cycles': 150} (battle_v4), seed 0: red (aggressor) "
                              "won after 150 steps")
    assert out[-1] == f"wrote {gif} (151 frames)"
    frames = [p.frame for p in simulate(replay, path, render=True)]
    # The GIF merges consecutive identical frames (units standing still) and adds up their time.
    distinct = 1 + sum(not np.array_equal(a, b) for a, b in zip(frames, frames[1:]))
    with Image.open(gif) as image:
        durations = []
        for k in range(image.n_frames):
            image.seek(k)
            durations.append(image.info["duration"])
        assert image.n_frames == distinct and image.size == (384, 448)  # a 96 x 112 render, scaled x4
    assert sum(durations) == 150 * replays.GIF_STEP_MS + 3 * replays.GIF_STEP_MS


def test_long_games_render_every_kth_step_and_the_last(battles, monkeypatch):
    monkeypatch.setattr(replays, "GIF_MAX_FRAMES", 40)
    assert replays.gif_stride(150) == 4 and replays.gif_stride(160) == 4 and replays.gif_stride(161) == 5
    positions = simulate(load_replay(battles[1]), battles[1], render=True)
    assert [p.move for p in positions if p.frame is not None] == [*range(0, 150, 4), 150]


def test_evaluate_records_battles_with_the_checkpoints_kwargs_and_tournaments_play_them(tmp_path, capsys):
    kwargs = {"map_size": 12, "max_cycles": 20}
    checkpoint = write_checkpoint(tmp_path / "run" / "checkpoints" / "latest.safetensors", "battle", kwargs)
    assert run.main(["evaluate", "--checkpoint", str(checkpoint), "--opponent", "random", "--games", "1",
                     "--record", str(tmp_path / "rec")]) == 0
    assert "as red: " in capsys.readouterr().out
    other = write_checkpoint(tmp_path / "other" / "checkpoints" / "latest.safetensors", "battle", kwargs)
    assert run.main(["evaluate", "--players", str(checkpoint), str(other), "random", "--games", "1",
                     "--record", str(tmp_path / "rr"), "--json", str(tmp_path / "rr.json")]) == 0
    result = json.loads((tmp_path / "rr.json").read_text())
    assert result["env"] == "battle" and result["env_kwargs"] == kwargs
    assert [m["mean_length"] for m in result["matches"]] == [20.0] * 6
    expected = {"rec": ["random-vs-run_main-0000.json", "run_main-vs-random-0000.json"],
                "rr": ["other_main-vs-random-0000.json", "other_main-vs-run_main-0000.json",
                       "random-vs-other_main-0000.json", "random-vs-run_main-0000.json",
                       "run_main-vs-other_main-0000.json", "run_main-vs-random-0000.json"]}
    for directory, names in expected.items():
        assert sorted(p.name for p in (tmp_path / directory).iterdir()) == names
        for name in names:
            replay = load_replay(tmp_path / directory / name)
            assert replay.kwargs == kwargs and replay.length == 20
            assert len(simulate(replay, tmp_path / directory / name)) == 21
    # A worker process of `--workers N` is told the env kwargs (the map size, 20 steps) on its command line.
    capsys.readouterr()
    assert _worker_main(["--env=battle", "--a-name=run/main", f"--a={checkpoint}", "--b-name=random", "--b=random",
                         "--games=1", "--seed=0", "--pair-index=0", f"--env-kwargs={json.dumps(kwargs)}"]) == 0
    assert [m["mean_length"] for m in json.loads(capsys.readouterr().out)] == [20.0, 20.0]


def test_a_tournament_of_checkpoints_trained_on_other_env_kwargs_exits_2(tmp_path, capsys):
    small = write_checkpoint(tmp_path / "a.safetensors", "battle", {"map_size": 12})
    large = write_checkpoint(tmp_path / "b.safetensors", "battle", {"map_size": 14})
    assert run.main(["evaluate", "--players", str(small), str(large), "--games", "1"]) == 2
    err = capsys.readouterr().err
    assert "players must all play one env: " in err and 'with env.kwargs {"map_size": 12}' in err
    assert 'with {"map_size": 14}' in err


def test_one_agent_episodes_are_recorded_and_re_simulated(tmp_path, capsys):
    checkpoint = write_checkpoint(tmp_path / "cp" / "checkpoints" / "latest.safetensors", "gym:CartPole-v1", {})
    assert run.main(["evaluate", "--checkpoint", str(checkpoint), "--games", "2",
                     "--record", str(tmp_path / "rec")]) == 0
    capsys.readouterr()
    paths = sorted((tmp_path / "rec").iterdir())
    assert [p.name for p in paths] == ["cp_main-0000.json", "cp_main-0001.json"]
    replay = load_replay(paths[0])
    positions = simulate(replay, paths[0])
    assert replay.rewards == [float(replay.length)] and len(replay.actions) == replay.length  # +1 per step
    assert positions[-1].returns == (float(replay.length),)
    assert run.main(["replay", str(paths[0]), "--gif", str(tmp_path / "x.gif")]) == 2
    assert "GIFs are drawn for PettingZoo games; gym:CartPole-v1 is a gymnasium env" in capsys.readouterr().err


def test_mpe_games_are_recorded_and_rendered(tmp_path, capsys):
    kwargs = {"max_cycles": 5}
    checkpoint = write_checkpoint(tmp_path / "tag" / "checkpoints" / "latest.safetensors", "mpe:simple_tag", kwargs)
    assert run.main(["evaluate", "--checkpoint", str(checkpoint), "--opponent", "random", "--games", "1",
                     "--record", str(tmp_path / "rec")]) == 0
    path = tmp_path / "rec" / "tag_main-vs-random-0000.json"
    replay = load_replay(path)
    assert replay.seats == ["adversary", "agent"] and replay.length == 5 and replay.kwargs == kwargs
    assert len(replay.actions) == 4 * 5  # three adversaries and one agent act at every step
    gif = tmp_path / "tag.gif"
    capsys.readouterr()
    assert run.main(["replay", str(path), "--final", "--gif", str(gif)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("step 5/5: adversary (tag/main) 3 units") and "(6 frames)" in out
    with Image.open(gif) as image:
        assert image.size == (448, 448)  # 700 x 700 render
