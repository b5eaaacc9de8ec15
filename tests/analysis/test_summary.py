"""The closing lines of a finished run, read from what it saved."""

from __future__ import annotations

import json

from impala_league.analysis.summary import duration, end_summary, evaluation_headline, pooled_score


def seat(score: float, games: int) -> dict:
    return {"score": score, "games": games}


def test_pooled_score_weights_each_seat_by_its_games():
    # (0.9 * 30 + 0.4 * 10) / 40 = 0.775, not the seats' plain mean 0.65
    assert pooled_score({"player_0": seat(0.9, 30), "player_1": seat(0.4, 10)}) == 0.775


def test_the_headline_keeps_the_judges_apart_from_the_bots():
    record = {"opponents": {"random": {"a": seat(1.0, 10), "b": seat(0.8, 10)}},
              "judges": {"mcts:100": {"a": seat(0.25, 4), "b": seat(0.75, 4)}}}
    assert evaluation_headline(record) == "score vs random 0.90; held out: mcts:100 0.50"
    assert evaluation_headline({"episodes": {"mean_return": 500.0, "games": 200}}) == \
        "mean return +500.0 over 200 episodes"
    assert evaluation_headline({}) is None


def test_the_headline_gives_the_solvers_positions_with_the_judges():
    record = {"judges": {"mcts:100": {"a": seat(0.5, 4), "b": seat(0.5, 4)}},
              "positions": {"all": {"blunder": 0.1419, "optimal": 0.795, "positions": 738}}}
    assert evaluation_headline(record) == "held out: mcts:100 0.50, solver's positions: blunder 14.2%"


def test_end_summary_reads_the_checkpoint_and_the_evaluation(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest.json").write_text(json.dumps({"agent_steps_trained": 500480, "elapsed_s": 30.2, "step": 782}))
    (tmp_path / "evaluation.json").write_text(json.dumps({"opponents": {"random": {"a": seat(0.75, 20)}}}))
    lines = end_summary(tmp_path, "tictactoe")
    assert lines[0] == "trained 500,480 agent steps in 30 s (782 updates)"
    assert lines[1] == "evaluation: score vs random 0.75"
    assert lines[-1].startswith(f"next: .venv/bin/python run.py report {tmp_path}")
    assert not any(line.startswith("wandb") for line in lines)  # no offline wandb run here
    assert [duration(s) for s in (42, 810, 7200)] == ["42 s", "13.5 min", "2.0 h"]
