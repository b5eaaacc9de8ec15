"""League scores per seat: metrics, payoff, and PFSP by the weaker seat."""

from __future__ import annotations

import numpy as np
import pytest

from impala_league.config import LeagueConfig
from impala_league.distributed.learner.metrics import seat_scores
from impala_league.league.matchmaking import league_exploiter_opponents
from impala_league.league.payoff import PayoffTable, episode_score


def _games(seat: int, wins: int, losses: int, draws: int = 0) -> list[dict]:
    """Results of the learner holding `seat` of two (winner -1 = draw)."""
    return ([{"learner_seat": seat, "winner": seat}] * wins + [{"learner_seat": seat, "winner": 1 - seat}] * losses
            + [{"learner_seat": seat, "winner": -1}] * draws)


def test_pooled_score_hides_the_weak_second_seat():
    # The tic-tac-toe league of the report: 0.553 as first player, 0.282 as second, 0.49 pooled
    # (913 of 1651 games won as first player, 141 of 500 as second).
    games = _games(0, 913, 738) + _games(1, 141, 359)
    pooled = float(np.mean([episode_score(e) for e in games]))
    scores = seat_scores(games, 2)
    assert pooled == pytest.approx(0.490, abs=5e-4)
    assert scores == {"league_score_seat_0": pytest.approx(913 / 1651), "league_score_seat_1": pytest.approx(0.282)}
    assert round(scores["league_score_seat_0"], 3) == 0.553
    # Draws count half; a seat without games is left out; a one-seat game has no per-seat score.
    assert seat_scores(_games(1, 1, 0, draws=1), 2) == {"league_score_seat_1": 0.75}
    assert seat_scores(_games(0, 3, 1), 1) == {}


def test_payoff_keeps_per_seat_win_rates_and_their_weaker_one():
    table = PayoffTable(decay=1.0, min_games=4)
    for e in _games(0, 9, 1) + _games(1, 3, 7):
        table.add("main", "main-0000100", episode_score(e), e["learner_seat"])
    assert table.win_rate("main", "main-0000100") == 0.6
    assert table.win_rate("main", "main-0000100", 0) == 0.9
    assert table.win_rate("main", "main-0000100", 1) == 0.3
    assert table.win_rate("main", "main-0000100", "weaker") == 0.3
    # The opponent's pooled record is the mirror image; its own seat records are not invented.
    assert table.win_rate("main-0000100", "main") == pytest.approx(0.4)
    # Round trip through the league state, and forgetting a reset player.
    again = PayoffTable.from_json(table.to_json(), 1.0, 4, table.seats_to_json())
    assert again.win_rate("main", "main-0000100", "weaker") == 0.3
    again.remove("main")
    assert again.seat_records == {} and again.records == {}


def test_weaker_seat_rate_falls_back_to_pooled_until_a_seat_has_enough_games():
    table = PayoffTable(decay=1.0, min_games=4)
    for e in _games(0, 2, 0) + _games(1, 0, 2):
        table.add("main", "random", episode_score(e), e["learner_seat"])
    assert table.win_rate("main", "random", 1) is None
    assert table.win_rate("main", "random", "weaker") == 0.5  # pooled: 4 games


def test_pfsp_can_weigh_by_the_weaker_seat():
    # Snapshot A: beaten 70% pooled but only 30% with seat 1; snapshot B: 50% on both seats.
    table = PayoffTable(decay=1.0, min_games=4)
    for opponent, games in {"A": _games(0, 18, 2) + _games(1, 3, 7),
                            "B": _games(0, 5, 5) + _games(1, 5, 5)}.items():
        for e in games:
            table.add("league_exploiter_0", opponent, episode_score(e), e["learner_seat"])
    assert table.win_rate("league_exploiter_0", "A") == pytest.approx(0.7)
    assert table.win_rate("league_exploiter_0", "A", "weaker") == pytest.approx(0.3)
    pooled = league_exploiter_opponents("league_exploiter_0", table, ["A", "B"], LeagueConfig(pfsp_p=2.0))
    weaker = league_exploiter_opponents("league_exploiter_0", table, ["A", "B"], LeagueConfig(pfsp_p=2.0, pfsp_seat="weaker"))
    # hard PFSP f(x) = (1 - x)^2: pooled A 0.09, B 0.25; weaker seat A 0.49, B 0.25.
    assert pooled["A"] == pytest.approx(0.09 / 0.34) and weaker["A"] == pytest.approx(0.49 / 0.74)


def test_the_report_plots_the_league_score_per_seat(tmp_path):
    import json

    from impala_league.analysis.report import run_figures
    from impala_league.analysis.runs import load_run
    from tests.analysis.test_report import _run_dir

    run_dir = _run_dir(tmp_path, "pooled", ["league.enabled=true"])
    assert run_figures(load_run(run_dir))["learning"][-1] is None  # no per-seat records: no figure
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({**last, "time": 1100.0, "step": 30, "agent_steps_trained": 7000, "league_score": 0.49,
                            "league_score_seat_1": 0.282, "league_score_seat_0": 0.553}) + "\n")
    fig = run_figures(load_run(run_dir))["learning"][-1]
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["league_score_seat_0", "league_score_seat_1"]
    assert fig.axes[0].lines[1].get_ydata().tolist() == [0.282]
