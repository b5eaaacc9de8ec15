"""run.py compare: the plans of the studies (corrections with and without replay), the table and its
confidence intervals against hand-computed values on written metrics, the IQM and its bootstrap
interval against hand values and against rliable, every seed's curve, and a seconds-long real
IMPALA-vs-A3C comparison on tictactoe."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from impala_league import REPO
from impala_league.agents.network import ActorCritic
from impala_league.analysis.compare import (actor_counts, aggregate_curve, bootstrap_interval, cell, iqm,
                                            mean_and_interval, plan, score_text, seeds_text, summarize,
                                            write_outputs)
from impala_league.analysis.report import compare_section
from impala_league.analysis.runs import load_run
from impala_league.config import load_config, to_yaml
from impala_league.agents.checkpoint import model_state, read_checkpoint
from impala_league.envs.registry import env_spec
import run


def _fake_run(root: Path, name: str, start: float, rows: list[tuple[float, int, float, float]], seed: int = 0):
    """A run directory whose metrics records are (seconds after start, frames, sps, episode_return)."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(to_yaml(load_config(None, ["env.name=tictactoe", f"run.seed={seed}"])))
    (run_dir / "started").write_text(str(start))
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"time": start + t, "agent_steps_trained": f, "sps": sps, "policy_lag": 1.0, "episode_return": ret}) + "\n"
        for t, f, sps, ret in rows))
    return load_run(run_dir)


def test_plans_of_both_studies():
    assert plan("algos", 5) == {"impala": ["learner.algo=impala", "league.enabled=false"],
                                "a3c": ["learner.algo=a3c", "league.enabled=false"]}
    corrections = plan("corrections", 30)
    assert list(corrections) == ["vtrace", "is1", "epsilon", "none"]
    assert all("actor.weight_delay=30" in o and "league.enabled=false" in o for o in corrections.values())
    assert "learner.correction=is1" in corrections["is1"]
    for overrides in [*corrections.values(), *plan("algos", 0).values()]:
        load_config(REPO / "configs/tictactoe.yaml", overrides)  # every variant is a valid config
    with pytest.raises(ValueError, match="unknown study"):
        plan("nope", 1)
    assert list(plan("corrections", 30, ["none", "vtrace"])) == ["vtrace", "none"]  # the study's order
    with pytest.raises(ValueError, match="--variants retrace: the corrections study has vtrace, is1"):
        plan("corrections", 30, ["retrace"])


def test_the_corrections_study_with_replay_pairs_each_correction_with_its_replay_variant():
    variants = plan("corrections", 20, replay_fraction=0.5)
    assert list(variants) == ["vtrace", "vtrace-replay", "is1", "is1-replay", "epsilon", "epsilon-replay",
                              "none", "none-replay"]
    base = ["learner.algo=impala", "league.enabled=false", "learner.correction=epsilon", "actor.weight_delay=20"]
    assert variants["epsilon"] == base
    assert variants["epsilon-replay"] == [*base, "learner.replay_fraction=0.5"]
    assert not any("replay" in o for name in ("vtrace", "is1", "epsilon", "none") for o in variants[name])
    # --variants takes the new names, in the study's order, with the fraction given.
    assert plan("corrections", 20, ["is1-replay", "vtrace"], replay_fraction=0.25) == {
        "vtrace": ["learner.algo=impala", "league.enabled=false", "learner.correction=vtrace", "actor.weight_delay=20"],
        "is1-replay": ["learner.algo=impala", "league.enabled=false", "learner.correction=is1", "actor.weight_delay=20",
                       "learner.replay_fraction=0.25"]}
    with pytest.raises(ValueError, match="--variants vtrace-replay: the corrections study has vtrace, is1"):
        plan("corrections", 20, ["vtrace-replay"])  # no replay variants without --replay
    for study in ("algos", "actors"):
        with pytest.raises(ValueError, match=f"--replay belongs to the corrections study .*not to '{study}'"):
            plan(study, 20, replay_fraction=0.5)


def test_replay_with_another_study_is_an_error_before_anything_runs(tmp_path, capsys):
    common = ["compare", "--config", str(REPO / "configs/tictactoe.yaml"), "--out", str(tmp_path / "cmp")]
    assert run.main([*common, "--study", "algos", "--replay"]) == 2
    assert "--replay belongs to the corrections study (IMPALA's Table 2), not to 'algos'" in capsys.readouterr().err
    assert run.main([*common, "--study", "corrections", "--replay-fraction", "0.5"]) == 2
    assert "--replay-fraction needs --replay" in capsys.readouterr().err
    assert run.main([*common, "--study", "corrections", "--replay", "--replay-fraction", "0"]) == 2
    assert "--replay-fraction must be in (0, 1]" in capsys.readouterr().err
    assert not (tmp_path / "cmp").exists()


def test_confidence_interval_matches_a_hand_computation():
    # Scores 1, 2, 3: mean 2, s = 1, half-width t(0.975, 2) * s / sqrt(3) = 4.303 * 1 / 1.732 = 2.484
    # (4.303: Student's t table, 2 degrees of freedom).
    mean, half = mean_and_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.303 / 3**0.5, abs=1e-3) and half == pytest.approx(2.484, abs=1e-3)
    assert mean_and_interval([1.0, None, 2.0, 3.0]) == (mean, half)  # a seed without a score is left out
    # Scores 10, 14: mean 12, s = sqrt(8), t(0.975, 1) = 12.706: 12.706 * 2.828 / 1.414 = 25.41.
    assert mean_and_interval([10.0, 14.0])[1] == pytest.approx(25.41, abs=1e-2)
    assert mean_and_interval([5.0]) == (5.0, None)  # one seed: no interval
    assert mean_and_interval([None]) == (None, None) and mean_and_interval([]) == (None, None)


def test_interquartile_mean_matches_hand_values():
    assert iqm([1.0, 2.0, 3.0, 4.0, 100.0]) == 3.0  # int(5 / 4) = 1 dropped from each end: mean of 2, 3, 4
    assert iqm([100.0, 4.0, 1.0, 3.0, 2.0]) == 3.0  # order does not matter
    assert iqm([0, 1, 2, 3, 4, 5, 6, 70]) == 3.5  # 2 dropped from each end: mean of 2, 3, 4, 5
    assert iqm([1.0, 2.0, 30.0]) == 11.0  # below four values nothing is dropped: the mean
    assert iqm([5.0]) == 5.0
    assert iqm([[1, 2, 3, 4, 100], [10, 10, 10, 10, -50]]).tolist() == [3.0, 10.0]  # one IQM per row


def test_bootstrap_interval_matches_hand_values():
    assert bootstrap_interval([5.0, 5.0, 5.0]) == (5.0, 5.0)  # identical seeds: every resample the same
    assert bootstrap_interval([5.0]) is None and bootstrap_interval([]) is None  # one run: no interval
    # Seeds 0 and 1: a resample's mean is 0 (p = 1/4), 0.5 (1/2) or 1 (1/4), so its 2.5% and 97.5%
    # percentiles are 0 and 1.
    assert bootstrap_interval([0.0, 1.0]) == (0.0, 1.0)
    # The interval lies inside the values' range and holds the IQM; the same scores give the same
    # interval (every call starts its own generator from BOOTSTRAP_SEED).
    scores = [0.31, 0.52, 0.47, 0.95, 0.12, 0.66, 0.58, 0.40, 0.73, 0.05]
    low, high = bootstrap_interval(scores)
    assert 0.05 <= low < iqm(scores) < high <= 0.95 and bootstrap_interval(scores) == (low, high)
    # Another statistic, the maximum of seeds 0, 1, 2, 3: a resample's maximum is 0 with p = 1/256,
    # at most 1 with p = 16/256 = 6.25% (> 2.5%), 3 with p = 1 - (3/4)^4 = 68%: percentiles 1 and 3.
    assert bootstrap_interval([0.0, 1.0, 2.0, 3.0], statistic=lambda x: x.max(axis=-1)) == (1.0, 3.0)


def test_iqm_and_bootstrap_interval_match_rliable():
    """rliable 1.2.0 (a development requirement) on [10 runs, 1 task]: the same point estimate to the
    last bit; the same interval when our resampling draws its indices (rliable draws from numpy's
    global generator); with our own generator, an interval close to its own."""
    library = pytest.importorskip("rliable.library")
    from rliable import metrics

    scores = [0.31, 0.52, 0.47, 0.95, 0.12, 0.66, 0.58, 0.40, 0.73, 0.05]
    iqm_of = lambda x: np.array([metrics.aggregate_iqm(x)])  # noqa: E731 (rliable's documented form)
    np.random.seed(7)
    points, intervals = library.get_interval_estimates({"v": np.array(scores)[:, None]}, iqm_of, reps=2000)
    assert iqm(scores) == points["v"][0] == metrics.aggregate_iqm(np.array(scores)[:, None])
    low, high = intervals["v"][:, 0]
    assert bootstrap_interval(scores, rng=np.random.RandomState(7)) == pytest.approx((low, high), abs=1e-12)
    assert bootstrap_interval(scores) == pytest.approx((low, high), abs=0.02)  # our generator, seeded 0
    assert iqm([1.0, 2.0, 3.0, 4.0, 100.0]) == metrics.aggregate_iqm(np.array([[1.0], [2], [3], [4], [100]]))


def test_the_curve_over_seeds_is_their_iqm_on_the_common_range():
    # Seed A: 0 -> 10 over 0..10 frames; seed B: 2 -> 22 over 0..20: in common 0..10, mean at 5 = (5 + 7) / 2.
    grid, middle = aggregate_curve([([0, 10], [0, 10]), ([0, 20], [2, 22])], points=3)
    assert grid.tolist() == [0, 5, 10] and middle.tolist() == [1, 6, 11]
    # Four seeds, constant 0, 1, 2, 100: one dropped from each end, IQM 1.5 everywhere.
    grid, middle = aggregate_curve([([0, 4], [y, y]) for y in (0, 1, 2, 100)], points=5)
    assert middle.tolist() == [1.5] * 5
    assert aggregate_curve([([0, 1], [0, 1]), ([2, 3], [0, 1])]) is None  # no range every seed covers
    assert aggregate_curve([]) is None


def test_several_seeds_give_iqm_and_interval_and_one_figure_with_every_seed(tmp_path):
    # outlier: 5 seeds, constant returns 1, 2, 3, 4, 100: mean 22 (t half-width 2.776 * 43.62 / sqrt 5
    # = 54.2), IQM 3; single: one seed.
    def runs(name, returns):
        return [_fake_run(tmp_path, f"{name}-seed{seed}", 1000.0, [(t, 100 * t, 10, r) for t in (10, 20, 30)], seed)
                for seed, r in enumerate(returns)]

    out = write_outputs({"outlier": runs("outlier", [1, 2, 3, 4, 100]), "single": runs("single", [0.5])}, tmp_path)
    v = out["variants"]["outlier"]
    assert v["final_score"] == 22 and v["final_score_ci95"] == pytest.approx(54.16, abs=0.01)
    assert v["final_score_iqm"] == 3 and v["final_score_seeds"] == 5
    assert v["final_score_iqm_ci95"] == list(bootstrap_interval([1, 2, 3, 4, 100]))
    assert out["statistics"]["bootstrap_resamples"] == 2000 and out["statistics"]["iqm_trim"] == 0.25
    table = (tmp_path / "compare.md").read_text(encoding="utf-8")
    assert "| outlier | final score | 5 | 22.0 ± 54.2 | 3.0 | [" in table
    assert "| single | final score | 1 | 0.500 (one run) | 0.500 | one run: none | 0.500 |" in table
    assert out["plots"][-1] == "curves_seeds.png" and (tmp_path / "curves_seeds.png").read_bytes()[:4] == b"\x89PNG"
    assert compare_section(tmp_path, 0).count("<img") == 3


def test_score_cells_show_the_mean_and_the_interval():
    assert score_text(117.2, 41.6) == "117 ± 42"
    assert score_text(32.44, 5.06) == "32.4 ± 5.1"
    assert score_text(0.5123, 0.0468) == "0.512 ± 0.047"
    assert score_text(9.5, 12.0) == "9.5 ± 12.0"  # the larger of the two sets the decimals
    assert score_text(0.5123, None) == "0.512 (one run)"
    assert score_text(117.2, None) == "117 (one run)"
    partial = {"final_score": 0.5, "final_score_ci95": 0.25, "final_score_seeds": 2, "runs": [{}, {}, {}]}
    assert cell(partial, "final_score", None) == "0.500 ± 0.250 (2 of 3 seeds)"  # a seed without a score
    assert cell({"final_score": None, "final_score_ci95": None}, "final_score", None) == "-"
    assert cell({"final_score": 0.25}, "final_score", None) == "0.250"  # a compare.json from before the intervals
    assert cell({"sps": 1234.4}, "sps", "{:.0f}") == "1234"
    # Over seeds with each seed's value: t(0.975, 1) = 12.706, s = 0.01414, half = 12.706 * 0.01414 / sqrt(2).
    assert seeds_text([1.0, 0.98, None]) == "0.990 ± 0.127 (1.000, 0.980, -)"
    assert seeds_text([97.0, 96.5, 98.0], digits=1) == "97.2 ± 1.9 (97.0, 96.5, 98.0)"  # s = 0.764, t(2) = 4.303
    assert seeds_text([0.5]) == "0.500 (one run)" and seeds_text([None, None]) == "none"
    assert score_text(0.5, 0.26, digits=1) == "0.5 ± 0.3"


def test_table_with_intervals_and_replay_pairs(tmp_path):
    # vtrace: 3 seeds, each with a constant return of 1, 2, 3; vtrace-replay: 1 seed, return 7;
    # is1: 2 seeds, returns 10 and 14 (no replay variant).
    def runs(name, returns):
        return [_fake_run(tmp_path, f"{name}-seed{seed}", 1000.0, [(t, 100 * t, 10, r) for t in (10, 20, 30)], seed)
                for seed, r in enumerate(returns)]

    study = {"vtrace": runs("vtrace", [1, 2, 3]), "vtrace-replay": runs("vtrace-replay", [7]),
             "is1": runs("is1", [10, 14])}
    summary = summarize(study)
    v, r = summary["variants"]["vtrace"], summary["variants"]["vtrace-replay"]
    assert v["seeds"] == [0, 1, 2] and v["final_score_per_seed"] == [1, 2, 3]
    for score in ("final_score", "score_at_equal_wall_clock", "score_at_equal_agent_steps"):
        assert v[score] == 2 and v[f"{score}_ci95"] == pytest.approx(2.484, abs=1e-3)
        assert r[score] == 7 and r[f"{score}_ci95"] is None and r[f"{score}_per_seed"] == [7]
    assert v["final_eval_score"] is None and v["final_eval_score_ci95"] is None  # no final_eval.json

    write_outputs(study, tmp_path, meta={"study": "corrections", "replay_fraction": 0.5})
    table = (tmp_path / "compare.md").read_text(encoding="utf-8")
    rows = [line for line in table.splitlines() if line.startswith("| vtrace") or line.startswith("| is1")]
    assert rows[0].endswith("| 2.000 ± 2.484 | 2.000 ± 2.484 | 2.000 ± 2.484 | - |")
    assert rows[0].startswith("| vtrace | 3 |") and rows[1].startswith("| vtrace-replay | 1 |")
    assert rows[1].endswith("| 7.000 (one run) | 7.000 (one run) | 7.000 (one run) | - |")
    assert rows[2].startswith("| is1 | 2 |") and "| 12.0 ± 25.4 |" in rows[2]
    assert "95% confidence interval of the mean (Student t with n - 1 degrees of freedom" in table
    # Table 2's layout: one row per correction, without and with replay side by side.
    assert "| correction | final score, no replay | final score, with replay (50% of each batch replayed) |" in table
    assert "| vtrace | 2.000 ± 2.484 | 7.000 (one run) |" in table and "| is1 | 12.0 ± 25.4 | - |" in table
    # Every score over seeds: the seeds counted, mean ± t, the IQM (3 seeds: the mean) and its bootstrap
    # interval; of [1, 2, 3] the 2.5% and 97.5% of 2,000 resamples' means are 1 and 3 (all three
    # draws 1, resp. 3, has probability 1/27 = 3.7%, above 2.5%); one seed: one run, no interval.
    assert "| vtrace | final score | 3 | 2.000 ± 2.484 | 2.000 | [1.000, 3.000] | 1.000, 2.000, 3.000 |" in table
    assert "| vtrace-replay | final score | 1 | 7.000 (one run) | 7.000 | one run: none | 7.000 |" in table
    assert "| is1 | score at equal agent steps | 2 | 12.0 ± 25.4 | 12.0 | [10.0, 14.0] | 10.0, 14.0 |" in table
    assert "final score vs bot" not in table.split("| variant | score |")[1]  # no seed has that score
    assert "2,000 resamples of the seeds with replacement, generator seeded 0" in table
    saved = json.loads((tmp_path / "compare.json").read_text())["variants"]["vtrace"]
    assert saved["final_score"] == 2 and saved["final_score_ci95"] == pytest.approx(2.484, abs=1e-3)
    assert saved["final_score_per_seed"] == [1, 2, 3]
    assert saved["final_score_iqm"] == 2 and saved["final_score_iqm_ci95"] == [1, 3] and saved["final_score_seeds"] == 3
    replayed = json.loads((tmp_path / "compare.json").read_text())["variants"]["vtrace-replay"]
    assert replayed["final_score_iqm"] == 7 and replayed["final_score_iqm_ci95"] is None
    page = compare_section(tmp_path, 0)
    assert "<td>2.000 ± 2.484</td>" in page and "<td>[1.000, 3.000]</td>" in page and "<td>one run: none</td>" in page
    write_outputs({"vtrace": study["vtrace"]}, tmp_path)  # without replay variants: no second table
    assert "no replay" not in (tmp_path / "compare.md").read_text(encoding="utf-8")


def test_table_values_match_a_hand_computation(tmp_path):
    # impala: 4 records at 10..40 s, 1000 frames each 10 s, sps 100; returns 0.1, 0.2, 0.3, 0.4.
    impala = _fake_run(tmp_path, "impala-seed0", 1000.0,
                       [(10, 1000, 100, 0.1), (20, 2000, 100, 0.2), (30, 3000, 100, 0.3), (40, 4000, 100, 0.4)])
    # a3c: ends at 30 s with 600 frames, sps 20; returns 0.0, 0.3, 0.6.
    a3c = _fake_run(tmp_path, "a3c-seed0", 5000.0, [(10, 200, 20, 0.0), (20, 400, 20, 0.3), (30, 600, 20, 0.6)])
    summary = summarize({"impala": [impala], "a3c": [a3c]})
    assert summary["metric"] == "episode_return"
    assert summary["equal_wall_clock_s"] == 30 and summary["equal_agent_steps"] == 600
    i, a = summary["variants"]["impala"], summary["variants"]["a3c"]
    assert i["sps"] == 100 and a["sps"] == 20 and a["sps_ratio"] == pytest.approx(0.2)
    assert i["final_score"] == pytest.approx((0.2 + 0.3 + 0.4) / 3)  # mean of the last 3 records
    assert i["score_at_equal_wall_clock"] == pytest.approx((0.1 + 0.2 + 0.3) / 3)  # records up to 30 s
    assert i["score_at_equal_agent_steps"] is None  # impala's first record already had 1000 > 600 frames
    assert a["score_at_equal_agent_steps"] == pytest.approx(0.3) and a["agent_steps_trained"] == 600
    out = write_outputs({"impala": [impala], "a3c": [a3c]}, tmp_path)
    table = (tmp_path / "compare.md").read_text()
    assert "| impala | 1 | 100 | 1.00 | 4,000 |" in table and "| a3c | 1 | 20 | 0.20 | 600 |" in table
    assert json.loads((tmp_path / "compare.json").read_text())["variants"]["a3c"]["agent_steps_trained"] == 600
    assert out["plots"] == ["curves_wall_clock.png", "curves_agent_steps.png", "curves_seeds.png"]
    assert all((tmp_path / p).read_bytes()[:4] == b"\x89PNG" for p in out["plots"])


def test_the_actors_study_plots_sps_against_actors_and_the_report_shows_it(tmp_path):
    assert actor_counts(1) == [1] and actor_counts(2) == [1, 2] and actor_counts(6) == [1, 2, 4, 6]
    variants = plan("actors", 0, actors=[1, 2, 4])
    assert list(variants) == ["actors1", "actors2", "actors4"] and "actor.num_actors=4" in variants["actors4"]
    for overrides in variants.values():
        assert load_config(REPO / "configs/tictactoe.yaml", overrides).actor.num_actors == int(overrides[-1][-1])
    runs = {f"actors{n}": [_fake_run(tmp_path, f"actors{n}-seed0", 1000.0, [(10, 100 * n, 10 * n, 0.0),
                                                                              (20, 200 * n, 10 * n, 0.0)])]
            for n in (1, 2, 4)}
    out = write_outputs(runs, tmp_path, meta={"study": "actors", "actors": {f"actors{n}": n for n in (1, 2, 4)}})
    assert [out["variants"][f"actors{n}"]["sps"] for n in (1, 2, 4)] == [10, 20, 40]
    assert out["plots"][0] == "sps_vs_actors.png" and (tmp_path / "sps_vs_actors.png").read_bytes()[:4] == b"\x89PNG"
    page = compare_section(tmp_path, 0)
    assert page.count("<img") == len(out["plots"]) == 4 and "study actors" in page


def test_seconds_long_comparison_of_impala_and_a3c(tmp_path, redis_url):
    # Long enough (a few seconds) that the actors' episode results, sent once a second, reach a metrics
    # record: a shorter run can end with none and so no score to plot.
    out = tmp_path / "cmp"
    cmd = [sys.executable, str(REPO / "run.py"), "compare", "--config", str(REPO / "configs/tictactoe.yaml"),
           "--redis-url", redis_url, "--out", str(out), "--seeds", "0", "--minutes", "1", "--agent-steps", "6400",
           "--eval-games", "2", "--eval-opponent", "random",
           "--set", "run.wandb_mode=disabled", "--set", "run.log_every_s=1", "--set", "actor.num_actors=1",
           "--set", "actor.num_envs=4", "--set", "actor.unroll_length=8", "--set", "learner.batch_size=4",
           "--set", "actor.high_water_mark=16"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "compare.json").read_text())
    assert list(summary["variants"]) == ["impala", "a3c"]
    for name, v in summary["variants"].items():
        assert v["sps"] > 0 and v["agent_steps_trained"] >= 6400, name
        assert 0.0 <= v["final_eval_score"] <= 1.0
        assert (out / f"{name}-seed0" / "checkpoints" / "latest.safetensors").is_file()
    assert "| impala | 1 |" in (out / "compare.md").read_text()
    assert (out / "curves_wall_clock.png").is_file()
    # The A3C run: its parameter server applied pushed gradients (one update each) and the weights moved.
    a3c_dir = out / "a3c-seed0"
    assert "started the parameter server" in (out / "a3c-seed0.log").read_text()
    tensors, metadata = read_checkpoint(a3c_dir / "checkpoints" / "latest.safetensors")
    assert json.loads(metadata["meta"])["step"] >= 2
    cfg = load_run(a3c_dir).config
    torch.manual_seed(cfg.run.seed)  # the parameter server's initial weights
    spec = env_spec(cfg.env.name, cfg.env.kwargs)
    initial = ActorCritic(spec.obs_shape, spec.num_actions, cfg.agent).state_dict()
    assert any(not torch.equal(initial[k], v) for k, v in model_state(tensors).items())
    records = load_run(a3c_dir).records
    assert records and records[-1]["dead_letters"] == 0 and all(r["policy_lag"] >= 0 for r in records)


def test_a_seed_whose_score_is_not_finite_is_left_out_and_named(tmp_path):
    # 5 seeds of constant returns 0.5, 0.6, 0.7, nan, 0.8: the statistics are those of the 4 finite ones.
    returns = [0.5, 0.6, 0.7, float("nan"), 0.8]
    runs = [_fake_run(tmp_path, f"nan-seed{seed}", 1000.0, [(t, 100 * t, 10, r) for t in (10, 20, 30)], seed)
            for seed, r in enumerate(returns)]
    out = write_outputs({"nan": runs}, tmp_path)
    v = out["variants"]["nan"]
    finite = [x for x in v["final_score_per_seed"] if not np.isnan(x)]  # the means of 0.5, 0.6, 0.7, 0.8
    assert len(finite) == 4 and v["final_score_seeds"] == 4 and v["final_score_left_out"] == [3]
    assert v["final_score"] == pytest.approx(0.65) and v["final_score_iqm"] == pytest.approx(0.65)
    assert v["final_score_ci95"] == pytest.approx(mean_and_interval(finite)[1])
    assert v["final_score_iqm_ci95"] == list(bootstrap_interval(finite))
    table = (tmp_path / "compare.md").read_text(encoding="utf-8")
    assert "| nan | final score | 4 (seed 3 left out: not finite) | 0.650 ± " in table and "[nan" not in table
    assert "0.650 ± 0.205 (4 of 5 seeds)" in table  # t(0.975, 3) = 3.182, s = 0.1291
    assert seeds_text(returns) == "0.650 ± 0.205 (0.500, 0.600, 0.700, nan, 0.800)"
    with pytest.raises(ValueError, match="not finite"):
        bootstrap_interval([0.5, float("inf")])
    with pytest.raises(ValueError, match="not finite"):
        mean_and_interval([0.5, float("nan")])
