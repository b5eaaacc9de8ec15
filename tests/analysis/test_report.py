"""run.py report: the page about a league run and a compare output renders in headless Chromium with
every section and its plots. The screenshot is kept in test-artifacts/report.png."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from impala_league import REPO
from impala_league.analysis.compare import write_outputs
from impala_league.analysis.report import _pyplot, build_report, figures, learner_device, over_training_figure
from impala_league.analysis.runs import load_run
from impala_league.config import load_config, to_yaml

ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


def _run_dir(root: Path, name: str, overrides: list[str], start: float = 1000.0) -> Path:
    """A run directory with 6 metrics records 10 s apart (frames 1000 per record, 4 updates per record)."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(to_yaml(load_config(None, ["env.name=tictactoe", *overrides])))
    (run_dir / "started").write_text(str(start))
    with (run_dir / "metrics.jsonl").open("w") as f:
        for i in range(1, 7):
            f.write(json.dumps({"time": start + 10 * i, "step": 4 * i, "agent_steps_trained": 1000 * i, "sps": 100.0 + i,
                                "queue_depth": 3, "policy_lag": 1.5, "policy_lag_counts": [2, 5, 1],
                                "mean_rho": 0.9, "rho_clipped_fraction": 0.1, "c_clipped_fraction": 0.1,
                                "episode_return": 0.1 * i, "league_score": 0.05 * i, "first_seat_win_rate": 0.5,
                                "draw_rate": 0.2, "episode_length": 7.0}) + "\n")
    return run_dir


def test_architecture_figures_are_the_runs_own(tmp_path):
    run = load_run(_run_dir(tmp_path, "r", ["learner.publish_every=2"]))
    f = figures(run)
    # the whole run: SPS 101..106 -> median 103.5; 20 updates in 50 s at one publish per 2 updates -> 0.2 / s.
    assert f["sps"] == pytest.approx(103.5) and f["queue_depth"] == 3 and f["policy_lag"] == 1.5
    assert f["publish_rate"] == pytest.approx(0.2)
    assert learner_device(run) == "auto (configured)"  # a run from before learner_device was recorded


def test_the_report_draws_what_a_long_run_recorded(tmp_path):
    """A league run with 7 snapshots, lags 69-89 past the counts' last bin (63 or more), rho and c clipped
    alike, a learner on cuda:0 and a wind-down record: every figure shows what happened."""
    from impala_league.analysis.report import MAX_ELO_LINES, lag_distribution, lag_histogram, league_figures, \
        run_figures

    run_dir = _run_dir(tmp_path, "r", ["league.enabled=true", "learner.device=auto"])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for i, r in enumerate(records):  # 4 unrolls at lag 2, 6 at lags of mean 69 + 4 i, the largest 69 + 4 i + 3
        mean = 69 + 4 * i
        r.update(policy_lag_counts=[0, 0, 4] + [0] * 60 + [6], policy_lag_max=mean + 3,
                 policy_lag=(4 * 2 + 6 * mean) / 10, learner_device="cuda:0")
    records[-1].update(sps=1.0, queue_depth=0)  # the actors stopped: not the run's throughput
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_dir / "league").mkdir()
    snapshots = [f"main-{200 * k:07d}" for k in range(1, 8)]
    (run_dir / "league" / "ratings.jsonl").write_text("".join(json.dumps(
        {"time": 1000.0 + k, "elo": {"main": float(k), "random": 0.0, **dict.fromkeys(snapshots[:k], 1.0)}}) + "\n"
        for k in range(1, 8)))
    payoff = [["main", s, 3, 1, 1] for s in snapshots] + [["main", "random", 9, 0, 1], [snapshots[0], "random", 0, 0, 0]]
    (run_dir / "league" / "state.json").write_text(json.dumps({"payoff": payoff}))
    run = load_run(run_dir)

    elo, pay = league_figures(run)
    assert len(elo.axes[0].get_lines()) == min(len(snapshots) + 2, MAX_ELO_LINES) == 9
    bars = [t.get_text() for t in pay.axes[0].get_yticklabels()]
    assert bars == ["random", *snapshots] and len(pay.axes[0].patches) == 8  # the main agent's row only
    assert "0.90 (10 games)" in [t.get_text() for t in pay.axes[0].texts]

    exact, placed, cut = lag_distribution(run.records)
    assert cut == 63 and exact[2] == 24 and exact.sum() == 24
    assert list(np.flatnonzero(placed)) == [69, 73, 77, 81, 85, 89] and placed.sum() == 36
    ax = lag_histogram(run).axes[0]
    heights = [(round(b.get_x() + b.get_width() / 2), b.get_height()) for b in ax.patches if b.get_height() > 0]
    assert len([x for x, _ in heights if 69 <= x <= 89]) == 6 and ax.get_xlim() == (1, 90)
    assert "63 or more" in ax.get_legend().get_texts()[1].get_text()

    vtrace = run_figures(run)["vtrace"][0].axes[0]
    assert [line.get_label() for line in vtrace.get_lines()] == ["mean_rho", "rho_clipped_fraction = c_clipped_fraction"]

    f = figures(run)
    assert f["sps"] == pytest.approx(102.5) and f["queue_depth"] == 3  # medians of 101..105 and the wind-down 1
    assert learner_device(run) == "cuda:0"
    page = build_report([run_dir])
    assert " frames" not in page.replace("emulator frames", "") and "agent steps trained" in page
    _pyplot().close("all")


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium); "
                    ".ci/run installs it when run as root")
def test_report_renders_every_section_with_its_plots_in_headless_chromium(tmp_path):
    league_run = _run_dir(tmp_path, "league-run", ["league.enabled=true"])
    (league_run / "league").mkdir()
    (league_run / "league" / "ratings.jsonl").write_text("".join(
        json.dumps({"time": 1000.0 + 10 * i, "games": 10 * i, "elo": {"main": 10.0 * i, "random": -10.0 * i}}) + "\n"
        for i in range(5)))
    (league_run / "league" / "state.json").write_text(json.dumps(
        {"payoff": [["main", "random", 8, 1, 1], ["random", "main", 1, 1, 8]]}))
    over = [{"step": 4 * k, "agent_steps_trained": 1000 * k, "games": 50, "opponents": {"tactical": _seats(0.2 * k, 0.5, 0.25 * k)}}
            for k in range(1, 4)]
    (league_run / "evaluation.json").write_text(json.dumps(
        {"checkpoint": "c", "step": 12, "agent_steps_trained": 3000, "seed": 0, "games": 100,
         "opponents": {"tactical": over[-1]["opponents"]["tactical"]}, "over_training": over}))
    cmp = tmp_path / "cmp"
    runs = {"impala": [load_run(_run_dir(cmp, "impala-seed0", []))],
            "a3c": [load_run(_run_dir(cmp, "a3c-seed0", ["learner.algo=a3c"], start=5000.0))]}
    write_outputs(runs, cmp)
    out = tmp_path / "report.html"
    proc = subprocess.run([sys.executable, str(REPO / "run.py"), "report", str(league_run), str(cmp), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    assert "<script" not in page and "http" not in page.split("<body>", 1)[1]  # self-contained

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1100,9000"]
    dom = subprocess.run([CHROMIUM, *flags, f"--screenshot={shot}", "--dump-dom", out.as_uri()], capture_output=True,
                         text=True, timeout=120).stdout
    sections = dict(re.findall(r'<section id="([^"]+)">(.*?)</section>', dom, re.S))
    expected = ["compare0"] + [f"run{k}-{s}" for k in (0, 1, 2) for s in
                               ("architecture", "learning", "throughput", "lag", "vtrace")] + ["run0-league",
                                                                                               "run0-evaluation"]
    assert sorted(sections) == sorted(expected), sorted(sections)
    for anchor, body in sections.items():
        images = re.findall(r'src="data:image/png;base64,([^"]+)"', body)
        assert images, f"section {anchor} has no plot"
        for data in images:
            width, height = Image.open(io.BytesIO(base64.b64decode(data))).size
            assert width > 200 and height > 150, anchor
    assert "parameter server" not in sections["run0-architecture"]  # drawn text is in the PNG, not the DOM
    assert sections["run0-league"].count("<img") == 2  # Elo over time and the main agent's payoff
    # the score against wall clock and against frames, and every seed's curve (curves_seeds.png)
    assert sections["compare0"].count("<img") == 3 and "<td>a3c</td>" in sections["compare0"]
    assert "<td>one run: none</td>" in sections["compare0"]  # one seed each: no interval

    image = Image.open(shot).convert("RGB")
    assert image.size == (1100, 9000)
    colours = len(image.resize((275, 2250)).getcolors(maxcolors=1 << 20))
    assert colours > 50, "the screenshot is (nearly) blank"
    print(f"report screenshot: {shot}")


def test_the_report_figures_go_to_an_offline_wandb_run(tmp_path, monkeypatch):
    import wandb

    from impala_league.analysis.report import log_to_wandb

    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = _run_dir(tmp_path, "league-run", ["league.enabled=true"])
    (run_dir / "league").mkdir()
    (run_dir / "league" / "state.json").write_text(json.dumps({"payoff": [["main", "random", 8, 1, 1]]}))
    wandb_run = wandb.init(project="test", dir=str(tmp_path), mode="offline", id="report-test")
    log_to_wandb(load_run(run_dir), wandb_run)
    wandb_run.finish()
    media = next(tmp_path.glob("wandb/offline-run-*-report-test/files/media"))
    images = sorted(p.relative_to(media / "images").as_posix() for p in (media / "images").rglob("*.png"))
    # architecture, 3 learning plots, throughput, lag, vtrace, the league's payoff (no ratings.jsonl)
    assert len(images) == 8 and any(p.startswith("report/architecture") for p in images), images
    table = json.loads(next((media / "table").rglob("*.json")).read_text())
    assert table["data"] == [["main", "random", 8, 1, 1]]


def _seats(win: float, taken: float | None, blocked: float | None) -> dict:
    tactics = {"wins_taken_rate": taken, "blocks_made_rate": blocked, "win_chances": 4, "wins_taken": 2,
               "block_chances": 2, "blocks_made": 1}
    return {seat: {"win_rate": win, "draw_rate": 0.0, "loss_rate": 1 - win, "tactics": tactics}
            for seat in ("player_1", "player_2")}


def test_the_report_plots_the_policies_over_training_beside_the_final_evaluation(tmp_path):
    run_dir = _run_dir(tmp_path, "r", [])
    over = [{"step": 4 * k, "agent_steps_trained": 1000 * k, "games": 50,
             "opponents": {"tactical": _seats(0.2 * k, 0.25 * k, None if k == 1 else 0.2 * k),
                           "minimax:9": _seats(0.0, None, 0.1 * k)}} for k in range(1, 5)]
    record = {"checkpoint": "c", "step": 16, "agent_steps_trained": 4000, "seed": 0, "games": 100,
              "opponents": {"tactical": over[-1]["opponents"]["tactical"]}, "over_training": over}
    fig = over_training_figure(record)
    # Rows: opponents; columns: win rate, wins taken, blocks made; a line per seat where it has points.
    assert fig.axes[0].get_title() == "vs tactical: win rate" and fig.axes[5].get_title() == "vs minimax:9: forced blocks made"
    assert [len(ax.get_lines()) for ax in fig.axes] == [2, 2, 2, 2, 0, 2]
    assert list(fig.axes[2].get_lines()[0].get_xdata()) == [2000, 3000, 4000]  # the game with no block chance left out
    assert list(fig.axes[0].get_lines()[0].get_ydata()) == pytest.approx([0.2, 0.4, 0.6, 0.8])
    (run_dir / "evaluation.json").write_text(json.dumps(record))
    section = re.search(r'<section id="run0-evaluation">(.*?)</section>', build_report([run_dir]), re.S).group(1)
    assert section.count("<img") == 1 and "2/4 (50%)" in section  # the plot, and the tactics in the table
    # Without over-training entries (older runs, one-agent envs): no plot, no error.
    assert over_training_figure({k: v for k, v in record.items() if k != "over_training"}) is None
    assert over_training_figure({**record, "over_training": []}) is None


def test_the_report_shows_the_held_out_judge_beside_the_bots(tmp_path):
    """A judge's row plots the score with its 95% interval below the bots' rows; its table stands apart."""
    run_dir = _run_dir(tmp_path, "r", [])

    def judged(score: float, low: float, high: float) -> dict:
        return {seat: {**result, "wins": 10, "draws": 5, "losses": 35, "games": 50, "score": score,
                       "score_ci95": [low, high]} for seat, result in _seats(0.2, 0.5, 0.5).items()}

    over = [{"step": 4 * k, "agent_steps_trained": 1000 * k, "games": 50, "opponents": {"tactical": _seats(0.2 * k, 0.5, 0.5)},
             "judges": {"mcts:100": judged(0.1 * k, 0.05 * k, 0.15 * k)}} for k in range(1, 4)]
    record = {"checkpoint": "c", "step": 12, "agent_steps_trained": 3000, "seed": 0, "games": 100,
              "opponents": {"tactical": over[-1]["opponents"]["tactical"]}, "judge_games": 50,
              "judges": over[-1]["judges"], "over_training": over}
    fig = over_training_figure(record)
    assert fig.axes[0].get_title() == "vs tactical: win rate"
    assert fig.axes[3].get_title() == "vs mcts:100 (held out): score, 95% interval"
    assert fig.axes[4].get_title() == "vs mcts:100 (held out): immediate wins taken"
    score_line = fig.axes[3].get_lines()[0]
    assert list(score_line.get_ydata()) == pytest.approx([0.1, 0.2, 0.3])
    (run_dir / "evaluation.json").write_text(json.dumps(record))
    section = re.search(r'<section id="run0-evaluation">(.*?)</section>', build_report([run_dir]), re.S).group(1)
    assert "held out: judges the run never trained against" in section
    assert "<td>mcts:100</td><td>player_1</td><td>10</td><td>5</td><td>35</td><td>0.300 [0.150, 0.450]</td><td>50</td>" \
        in section


def test_the_payoff_figure_of_a_league_of_hundreds_of_snapshots_keeps_the_newest(tmp_path):
    """300 snapshots would make a figure 8,000 pixels tall: it shows the main agent against random and the
    newest 39 snapshots."""
    from impala_league.analysis.report import MAX_PAYOFF_PLAYERS, league_figures

    run_dir = _run_dir(tmp_path, "long-league", ["league.enabled=true"])
    (run_dir / "league").mkdir()
    snapshots = [f"main-{step:07d}" for step in range(0, 300 * 200, 200)]
    members = {"main": {"kind": "learner"}, "random": {"kind": "bot"},
               **{s: {"kind": "snapshot", "step": int(s[5:])} for s in snapshots}}
    payoff = [["main", s, 5, 0, 5] for s in snapshots] + [["main", "random", 8, 1, 1]]
    (run_dir / "league" / "state.json").write_text(json.dumps({"members": members, "payoff": payoff}))
    (fig,) = league_figures(load_run(run_dir))
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert len(labels) == MAX_PAYOFF_PLAYERS and {"random", snapshots[-1]} <= set(labels) and "main" not in labels
    assert snapshots[-MAX_PAYOFF_PLAYERS + 1] in labels and snapshots[-MAX_PAYOFF_PLAYERS] not in labels


def test_the_elo_figure_of_a_league_of_thousands_draws_learners_bots_and_the_newest_snapshots(tmp_path):
    """2,000 snapshots in ratings.jsonl: the figure draws main, random and the 10 newest, with a legend."""
    from impala_league.analysis.report import MAX_ELO_LINES, league_figures

    run_dir = _run_dir(tmp_path, "long-league", ["league.enabled=true"])
    (run_dir / "league").mkdir()
    snapshots = [f"main-{step:07d}" for step in range(1, 2001)]
    lines = [{"time": 1000.0 + k, "elo": {"main": float(k), "random": -1.0,
                                          **{s: 0.0 for s in snapshots[:(k + 1) * 200]}}} for k in range(10)]
    (run_dir / "league" / "ratings.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (fig,) = league_figures(load_run(run_dir))
    drawn = sorted(line.get_label() for line in fig.axes[0].get_lines())
    assert drawn == sorted(["main", "random", *snapshots[-(MAX_ELO_LINES - 2):]])
    assert fig.axes[0].get_legend() is not None
