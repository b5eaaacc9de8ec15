"""run.py compare --study league: the arm table (valid configs, no judge as a training opponent, the arms
differ as named, the bots arm's games all go to the bots by PFSP), the aggregation of judge scores and
round-robin Elo over seeds on hand-made results, the options' errors, and a seconds-long real study of
two arms on tic-tac-toe."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import run
from impala_league import REPO
from impala_league.analysis.compare import bootstrap_interval
from impala_league.analysis.league_study import (ARMS, DEFAULT_CONFIG, DEFAULT_JUDGES, arm_plan, check_arms,
                                                 elo_text, write_league_outputs)
from impala_league.analysis.report import compare_section
from impala_league.analysis.runs import load_run
from impala_league.checked_config import load_config
from impala_league.config import ConfigError, to_yaml
from impala_league.evaluation.judges import is_judge_spec
from impala_league.evaluation.tournament import Player, summarize as tournament_summary
from impala_league.league.matchmaking import SELF, main_agent_opponents, pfsp_probabilities
from impala_league.league.payoff import PayoffTable


def test_every_arm_is_a_valid_config_without_a_judge_among_its_bots_and_the_arms_differ_as_named():
    assert list(ARMS) == ["selfplay", "pfsp", "pfsp-main-exploiters", "pfsp-league-exploiters", "bots", "main-job"]
    assert all(arm.meaning and "\n" not in arm.meaning for arm in ARMS.values())
    cfg = {name: load_config(DEFAULT_CONFIG, overrides) for name, overrides in arm_plan().items()}
    for name, c in cfg.items():
        assert not any(is_judge_spec(b) or b in DEFAULT_JUDGES for b in c.league.bots), name
        assert c.env.name == "connect_four" and c.evaluation.judges == list(DEFAULT_JUDGES), name
    league = {name: c.league for name, c in cfg.items()}
    assert not league["selfplay"].enabled and league["selfplay"].bots == []
    for name in ("pfsp", "pfsp-main-exploiters", "pfsp-league-exploiters"):
        assert league[name].enabled and league[name].bots == [] and league[name].bot_share == 0, name
        # The config's main-agent mix (AlphaStar's 35 / 50 / 15) over its own snapshots.
        assert (league[name].self_play, league[name].pfsp, league[name].forgotten) == (0.35, 0.5, 0.15), name
    exploiters = {name: (lg.main_exploiters, lg.league_exploiters) for name, lg in league.items()}
    assert exploiters == {"selfplay": (0, 0), "pfsp": (0, 0), "pfsp-main-exploiters": (1, 0),
                          "pfsp-league-exploiters": (0, 1), "bots": (0, 0), "main-job": (0, 0)}
    bots = league["bots"]
    assert bots.enabled and bots.bots == ["random", "tactical", "minimax:2"]
    assert (bots.self_play, bots.pfsp, bots.forgotten, bots.bot_share) == (0, 0, 0, 1)
    assert bots.snapshot_every >= 10**9
    assert cfg["main-job"] == load_config(DEFAULT_CONFIG, [])  # the config as it is
    assert league["main-job"].bot_share == 0.2 and league["main-job"].bots == ["random", "tactical", "minimax:2"]
    assert check_arms(DEFAULT_CONFIG, [], arm_plan(), list(DEFAULT_JUDGES)) == cfg
    assert list(arm_plan(["main-job", "selfplay"])) == ["selfplay", "main-job"]  # the table's order
    with pytest.raises(ValueError, match="--variants nope: the league study has selfplay, pfsp"):
        arm_plan(["nope"])


def test_the_bots_arm_plays_only_the_bots_by_pfsp_and_the_pfsp_arm_only_itself_and_its_snapshots():
    cfg = check_arms(DEFAULT_CONFIG, [], arm_plan(["bots", "pfsp"]), list(DEFAULT_JUDGES))
    payoff = PayoffTable(decay=1.0, min_games=1)  # main's win rates: random 1, tactical 1/2, minimax:2 0
    for score, opponent in ((1.0, "random"), (1.0, "tactical"), (0.0, "tactical"), (0.0, "minimax:2")):
        payoff.add("main", opponent, score)
    bots = ["random", "tactical", "minimax:2"]
    mix = main_agent_opponents("main", payoff, bots, [], cfg["bots"].league, bots)  # a league of bots only
    expected = pfsp_probabilities([1.0, 0.5, 0.0], "hard", 2.0)  # (1 - x)^2: 0, 0.25, 1 -> 0, 0.2, 0.8
    assert mix == pytest.approx({"tactical": expected[1], "minimax:2": expected[2]}) and SELF not in mix
    assert mix["minimax:2"] == pytest.approx(0.8)
    snapshots = ["main-0001000", "main-0002000"]
    mix = main_agent_opponents("main", payoff, snapshots, snapshots, cfg["pfsp"].league, [])
    assert set(mix) == {SELF, *snapshots} and mix[SELF] == pytest.approx(0.35 + 0.15)  # nothing forgotten yet


def test_a_judge_among_an_arms_bots_is_refused_before_anything_runs(tmp_path, capsys):
    with pytest.raises(ConfigError, match="arm bots: league.bots: 'minimax:2' is a judge"):
        check_arms(DEFAULT_CONFIG, [], arm_plan(), ["minimax:2"])
    common = ["compare", "--study", "league", "--out", str(tmp_path / "cmp")]
    assert run.main([*common, "--judges", "mcts:100", "tactical"]) == 2
    err = capsys.readouterr().err
    assert "arm bots: league.bots: 'tactical' is a judge" in err and "or from --judges" in err, err
    assert run.main([*common, "--judges", "mcts:0"]) == 2
    assert "judge 'mcts:0'" in capsys.readouterr().err
    assert run.main([*common, "--eval-opponent", "tactical"]) == 2
    assert "--eval-opponent is not an option of the league study" in capsys.readouterr().err
    assert run.main([*common, "--variants", "league"]) == 2
    assert "--variants league: the league study has selfplay" in capsys.readouterr().err
    assert run.main(["compare", "--config", str(REPO / "configs/tictactoe.yaml"), "--judge-games", "3"]) == 2
    assert "--judge-games belongs to the league study" in capsys.readouterr().err
    assert not (tmp_path / "cmp").exists()


def _fake_run(root: Path, arm: str, seed: int, frames: int, snapshots: int = 0):
    """A finished run directory of `arm`: 3 metrics records (10, 20, 30 s), `frames` at the end."""
    run_dir = root / f"{arm}-seed{seed}"
    (run_dir / "league" / "snapshots").mkdir(parents=True)
    for k in range(snapshots):
        (run_dir / "league" / "snapshots" / f"main-{k}.safetensors").write_bytes(b"")
    (run_dir / "config.yaml").write_text(to_yaml(load_config(None, ["env.name=tictactoe", f"run.seed={seed}"])))
    (run_dir / "started").write_text("1000")
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"time": 1000 + t, "agent_steps_trained": frames * t // 30, "sps": 10, "policy_lag": 1.0,
                    "episode_return": 0.0}) + "\n" for t in (10, 20, 30)))
    return load_run(run_dir)


def _judged(score_100: float, score_400: float) -> dict:
    """`judge_run`'s result with the given pooled scores (seat 0 / seat 1 at score +- 0.1)."""
    return {judge: {"score": s, "seats": {"player_0": {"score": s + 0.1}, "player_1": {"score": s - 0.1}}}
            for judge, s in (("mcts:100", score_100), ("mcts:400", score_400))}


def test_judge_scores_and_elo_over_seeds_match_a_hand_computation(tmp_path):
    runs = {"selfplay": [_fake_run(tmp_path, "selfplay", s, 3000 + s) for s in (0, 1, 2)],
            "bots": [_fake_run(tmp_path, "bots", 0, 2000)]}
    judged = {"selfplay-seed0": _judged(0.2, 0.0), "selfplay-seed1": _judged(0.4, 0.1),
              "selfplay-seed2": _judged(0.6, 0.2), "bots-seed0": _judged(0.9, 0.5)}
    # A hand-made round-robin of the four policies, 4 games per pair and seat: bots-seed0 wins all its
    # games, the selfplay seeds draw each other.
    names = ["selfplay-seed0", "selfplay-seed1", "selfplay-seed2", "bots-seed0"]
    players = [Player(n, "checkpoint", f"/x/{n}", n) for n in names]
    matches = [{"first": a, "second": b, "games": 4, "first_wins": 4 * (a == "bots-seed0"), "draws": 0 if "bots-seed0"
                in (a, b) else 4, "second_wins": 4 * (b == "bots-seed0"), "mean_length": 9.0}
               for i, x in enumerate(names) for y in names[i + 1:] for a, b in ((x, y), (y, x))]
    tournament = tournament_summary("tictactoe", players, matches, 4, 0, False)
    elo = {r["name"]: r["elo"] for r in tournament["ratings"]}
    meta = {"study": "league", "judges": ["mcts:100", "mcts:400"], "judge_games": 10, "seeds": [0, 1, 2]}
    summary = write_league_outputs(runs, judged, tournament, tmp_path, meta)
    s, b = summary["variants"]["selfplay"], summary["variants"]["bots"]
    # mcts:100 over the selfplay seeds: 0.2, 0.4, 0.6: mean 0.4, s = 0.2, t(0.975, 2) = 4.303: h = 0.4969.
    assert s["judge_mcts:100"] == pytest.approx(0.4) and s["judge_mcts:100_ci95"] == pytest.approx(0.4969, abs=1e-4)
    assert s["judge_mcts:100_per_seed"] == [0.2, 0.4, 0.6] and s["judge_mcts:100_seeds"] == 3
    assert s["judge_mcts:400"] == pytest.approx(0.1) and s["judge_mcts:400_iqm_ci95"] == list(
        bootstrap_interval([0.0, 0.1, 0.2]))
    assert b["judge_mcts:100"] == 0.9 and b["judge_mcts:100_ci95"] is None  # one seed: no interval
    # The arm's Elo is the mean of its seeds' fitted ratings; the ratings have mean 0, and the three
    # selfplay seeds, alike in every game, are rated alike.
    assert s["elo_per_seed"] == [elo[n] for n in names[:3]] and s["elo"] == pytest.approx(np.mean(s["elo_per_seed"]))
    assert b["elo"] == elo["bots-seed0"] == pytest.approx(-3 * s["elo"]) and b["elo"] > 200
    assert max(s["elo_per_seed"]) - min(s["elo_per_seed"]) < 1e-6 and s["elo_ci95"] == pytest.approx(0, abs=1e-4)
    assert [row["snapshots"] for row in s["runs"]] == [0, 0, 0] and s["agent_steps_trained"] == 3001
    table = (tmp_path / "compare.md").read_text(encoding="utf-8")
    assert "| selfplay | 3 | 3,001 | 0.400 ± 0.497 | 0.100 ± 0.248 |" in table
    assert f"| bots | 1 | 2,000 | 0.900 (one run) | 0.500 (one run) | {b['elo']:+.0f} (one run) |" in table
    assert "| selfplay-seed1 | 3,001 | 0 | 0.50 / 0.30 | 0.20 / 0.00 |" in table
    assert "| selfplay | vs mcts:100 | 3 | 0.400 ± 0.497 | 0.400 | [" in table  # compare's table over seeds
    assert "## Training" in table and "4 games per pair and seat, sampled" in table
    assert summary["plots"][0] == "league_study.png" and (tmp_path / "league_study.png").read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert saved["variants"]["selfplay"]["judge_mcts:100_per_seed"] == [0.2, 0.4, 0.6]
    assert saved["round_robin"]["ratings"][0]["name"] == "bots-seed0"
    page = compare_section(tmp_path, 0)  # `run.py report OUT` shows the judges, the Elo and the figure
    assert "<td>vs mcts:400</td>" in page and "<td>round-robin Elo</td>" in page
    assert page.count("<img") == len(summary["plots"])
    assert elo_text({"elo": 12.4, "elo_ci95": 30.2, "elo_seeds": 2, "runs": [{}, {}, {}]}) == "+12 ± 30 (2 of 3 seeds)"
    assert elo_text({"elo": None}) == "-"


def test_seconds_long_league_study_of_two_arms_on_tictactoe(tmp_path, redis_url):
    out = tmp_path / "cmp"
    cmd = [sys.executable, str(REPO / "run.py"), "compare", "--study", "league",
           "--config", str(REPO / "configs/tictactoe_league.yaml"), "--variants", "selfplay", "bots",
           "--redis-url", redis_url, "--out", str(out), "--seeds", "0", "--minutes", "1", "--agent-steps", "640",
           "--judges", "mcts:10", "--judge-games", "2", "--round-robin-games", "2",
           "--set", "run.wandb_mode=disabled", "--set", "run.log_every_s=1", "--set", "actor.num_actors=1",
           "--set", "actor.num_envs=4", "--set", "actor.unroll_length=8", "--set", "learner.batch_size=4",
           "--set", "actor.high_water_mark=16", "--set", "league.manager_every_s=0.5"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "compare.json").read_text())
    assert list(summary["variants"]) == ["selfplay", "bots"] and summary["judges"] == ["mcts:10"]
    for name, v in summary["variants"].items():
        assert v["agent_steps_trained"] >= 640 and 0.0 <= v["judge_mcts:10"] <= 1.0, name
        judged = json.loads((out / f"{name}-seed0" / "judges.json").read_text())
        assert judged["games_per_seat"] == 2 and set(judged["judges"]["mcts:10"]["seats"]) == {"player_1", "player_2"}
        assert v["elo"] is not None and v["runs"][0]["snapshots"] == 0
    assert load_run(out / "bots-seed0").config.league.enabled and not load_run(out / "selfplay-seed0").config.league.enabled
    assert sum(r["games"] for r in summary["round_robin"]["ratings"]) == 2 * 4  # one pair, 2 games a seat, 2 players
    assert "| selfplay | 1 |" in proc.stdout and (out / "league_study.png").is_file()
