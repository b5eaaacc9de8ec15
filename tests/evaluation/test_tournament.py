"""Tests for evaluation/elo.py, evaluation/tournament.py and `run.py evaluate --players`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import run
from impala_league.agents.network import ActorCritic
from impala_league.config import load_config, to_yaml
from impala_league.agents.checkpoint import save_checkpoint
from impala_league.envs.registry import env_spec
from impala_league.evaluation.elo import ELO_PER_NAT, fit_elo
from impala_league.evaluation.tournament import PlayerError, resolve_players, round_robin

# -- Elo fit -----------------------------------------------------------------------------------------


def results(pairs: dict[tuple[int, int], tuple[float, float]], n: int) -> tuple[np.ndarray, np.ndarray]:
    """points, games matrices from {(i, j): (points of i, games)}."""
    points, games = np.zeros((n, n)), np.zeros((n, n))
    for (i, j), (p, g) in pairs.items():
        points[i, j], points[j, i] = p, g - p
        games[i, j] = games[j, i] = g
    return points, games


def test_two_players_75_percent_are_190_8_elo_apart_with_hand_computed_stderr():
    # 300 points of 400 games (300 wins, or 200 wins and 200 draws: the fit sees only points).
    fit = fit_elo(np.array([[0, 300], [100, 0]], float), np.array([[0, 400], [400, 0]], float), prior_draws=0)
    assert fit.ratings[0] - fit.ratings[1] == pytest.approx(400 * np.log10(3), abs=1e-6)  # 190.85
    assert fit.ratings.sum() == pytest.approx(0, abs=1e-9)
    # Var(r0 - r1) = 1 / (n p (1 - p)) nats²; with mean 0, r0 = (r0 - r1) / 2.
    se_diff = ELO_PER_NAT / np.sqrt(400 * 0.75 * 0.25)  # 20.06 Elo
    assert fit.stderr == pytest.approx([se_diff / 2, se_diff / 2], rel=1e-9)


def test_the_light_prior_keeps_an_undefeated_player_finite():
    points, games = results({(0, 1): (40, 40)}, 2)
    fit = fit_elo(points, games)  # one virtual draw: 40.5 points of 41
    assert fit.ratings[0] - fit.ratings[1] == pytest.approx(400 * np.log10(40.5 / 0.5), abs=1e-6)  # 763
    with pytest.raises(ValueError, match="no finite rating"):
        fit_elo(points, games, prior_draws=0)
    # With many games the prior hardly moves a 75% score: 3000.5 of 4001 points, 0.06 Elo less.
    points, games = results({(0, 1): (3000, 4000)}, 2)
    assert fit_elo(points, games).ratings[0] * 2 == pytest.approx(400 * np.log10(3000.5 / 1000.5), abs=1e-6)


def log_likelihood(ratings: np.ndarray, points: np.ndarray) -> float:
    diff = (ratings[:, None] - ratings[None, :]) / ELO_PER_NAT
    return float(np.sum(points * np.log(1 / (1 + np.exp(-diff)))))


def test_three_players_match_a_minorization_maximization_reference():
    # 0 beats 1 70-30, 1 beats 2 55-45 (10 draws inside), 0 beats 2 80-20 (uneven game counts).
    points, games = results({(0, 1): (70, 100), (1, 2): (55, 100), (0, 2): (48, 60)}, 3)
    fit = fit_elo(points, games, prior_draws=0)
    # Reference: Zermelo / Hunter (2004) MM iteration gamma_i <- W_i / sum_j n_ij / (gamma_i + gamma_j).
    gamma = np.ones(3)
    for _ in range(20_000):
        gamma = points.sum(1) / (games / (gamma[:, None] + gamma[None, :])).sum(1)
        gamma /= np.exp(np.log(gamma).mean())
    reference = 400 * np.log10(gamma)
    np.testing.assert_allclose(fit.ratings, reference - reference.mean(), atol=1e-6)
    # Standard errors: pseudo-inverse of a central-difference Hessian of -L at the fit.
    h, hessian = 1e-2, np.zeros((3, 3))
    for a in range(3):
        for b in range(3):
            def ll(da, db):
                r = fit.ratings.copy()
                r[a] += da
                r[b] += db
                return log_likelihood(r, points)
            hessian[a, b] = -(ll(h, h) - ll(h, -h) - ll(-h, h) + ll(-h, -h)) / (4 * h * h)
    # The common shift is a null direction; differencing noise there must not be inverted.
    centre = np.eye(3) - 1 / 3
    covariance = np.linalg.pinv(centre @ hessian @ centre, rcond=1e-6, hermitian=True)
    np.testing.assert_allclose(fit.covariance, covariance, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(fit.stderr, np.sqrt(np.diag(covariance)), rtol=1e-4)


def test_fit_rejects_inconsistent_or_disconnected_results():
    points, games = results({(0, 1): (3, 4)}, 2)
    with pytest.raises(ValueError, match="symmetric"):
        fit_elo(points, games + np.eye(2)[::-1] * np.array([[0, 1], [0, 0]]))
    points, games = results({(0, 1): (3, 4), (2, 3): (1, 4)}, 4)
    with pytest.raises(ValueError, match="not all connected"):
        fit_elo(points, games)


# -- players ---------------------------------------------------------------------------------------

def write_checkpoint(path: Path, env: str = "tictactoe", meta: dict | None = None, seed: int = 0) -> Path:
    """A randomly initialised policy of `env`, saved in the learner's checkpoint format."""
    cfg = load_config(None, [f"env.name={env}", "agent.torso=mlp", "agent.hidden=16", "agent.mlp_layers=1"])
    spec = env_spec(env)
    torch.manual_seed(seed)
    model = ActorCritic(spec.obs_shape, spec.num_actions, cfg.agent)
    save_checkpoint(path, model, None, to_yaml(cfg), meta or {"step": 10, "agent_steps_trained": 320})
    return path


@pytest.fixture(scope="module")
def league_run(tmp_path_factory) -> Path:
    """runs/alpha: a main learner, an exploiter learner and two league snapshots (tic-tac-toe)."""
    run_dir = tmp_path_factory.mktemp("runs") / "alpha"
    write_checkpoint(run_dir / "checkpoints" / "latest.safetensors", seed=1)
    write_checkpoint(run_dir / "checkpoints" / "exploiter" / "latest.safetensors", seed=2)
    snapshots = run_dir / "league" / "snapshots"
    write_checkpoint(snapshots / "b.safetensors", meta={"id": "main-200", "player": "main", "step": 200,
                                                        "agent_steps_trained": 6400}, seed=3)
    write_checkpoint(snapshots / "a.safetensors", meta={"id": "main-100", "player": "main", "step": 100,
                                                        "agent_steps_trained": 3200}, seed=4)
    return run_dir


def test_run_directory_expands_to_learners_and_snapshots(league_run):
    env, players = resolve_players([str(league_run), "random", "minimax:2"])
    assert env == "tictactoe"
    assert [p.name for p in players] == ["alpha/main", "alpha/exploiter", "main-100", "main-200", "random",
                                         "minimax:2"]
    assert [p.kind for p in players] == ["checkpoint"] * 4 + ["bot"] * 2
    assert players[2].meta["agent_steps_trained"] == 3200 and Path(players[2].load).name == "a.safetensors"
    # A file given directly is named the same way, and a file reached twice is entered once.
    direct = str(league_run / "checkpoints" / "exploiter" / "latest.safetensors")
    env, players = resolve_players([direct, str(league_run)])
    assert [p.name for p in players] == ["alpha/exploiter", "alpha/main", "main-100", "main-200"]


def test_names_met_twice_are_numbered(tmp_path):
    write_checkpoint(tmp_path / "x" / "policy.safetensors")
    write_checkpoint(tmp_path / "y" / "policy.safetensors")
    _, players = resolve_players([str(tmp_path / "x" / "policy.safetensors"),
                                  str(tmp_path / "y" / "policy.safetensors")])
    assert [p.name for p in players] == ["policy", "policy#2"]


@pytest.mark.parametrize("specs, env, message", [
    (["random", "alphazero"], "tictactoe", r"player 'alphazero': not a bot \(random, tactical, minimax:D, mcts:N, solver or solver:E\)"),
    (["random", "minimax:0"], "tictactoe", r"player 'minimax:0': bot 'minimax:0': depth 0 is out of range"),
    (["random", "minimax:9"], "connect_four", r"player 'minimax:9'.*choose 1..8"),
    (["random", "tactical"], None, r"only bots were given: name the game with --env"),
    (["random", "random"], "tictactoe", r"player 'random' is given twice"),
    (["random"], "tictactoe", r"at least 2 players"),
    (["random", "tactical"], "chess", r"--env: unknown env 'chess'"),
    (["random", "nowhere/latest.safetensors"], "tictactoe", r"'nowhere/latest.safetensors': no such checkpoint"),
])
def test_bad_player_specs_name_the_spec(specs, env, message):
    with pytest.raises(PlayerError, match=message):
        resolve_players(specs, env)


def test_corrupt_foreign_and_empty_players_are_rejected(tmp_path, league_run):
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all")
    with pytest.raises(PlayerError, match=r"player '.*corrupt.safetensors': .*corrupt.safetensors is not a readable"):
        resolve_players([str(corrupt), "random"], "tictactoe")
    c4 = write_checkpoint(tmp_path / "c4.safetensors", env="connect_four")
    with pytest.raises(PlayerError, match=r"players must all play one env: '.*alpha' plays tictactoe but "
                                          r"'.*c4.safetensors' plays connect_four"):
        resolve_players([str(league_run), str(c4)])
    with pytest.raises(PlayerError, match=r"'.*c4.safetensors' plays connect_four, not tictactoe"):
        resolve_players([str(c4), "random"], "tictactoe")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PlayerError, match=r"'.*empty': a directory without checkpoints"):
        resolve_players([str(tmp_path / "empty"), "random"], "tictactoe")


# -- round-robin -----------------------------------------------------------------------------------

def test_round_robin_counts_every_game_and_rates_the_perfect_player_first(league_run):
    env, players = resolve_players([str(league_run), "random", "minimax:9"])
    result = round_robin(env, players, games=6, seed=3)
    n = len(players)
    assert len(result["matches"]) == n * (n - 1)  # every ordered pair once
    for match in result["matches"]:
        assert match["games"] == 6 and match["first_wins"] + match["draws"] + match["second_wins"] == 6
    ratings = {r["name"]: r for r in result["ratings"]}
    assert set(ratings) == {p.name for p in players}
    for r in ratings.values():
        assert r["games"] == 2 * 6 * (n - 1) and r["wins"] + r["draws"] + r["losses"] == r["games"]
    assert result["ratings"][0]["name"] == "minimax:9" and ratings["minimax:9"]["losses"] == 0
    assert sum(r["elo"] for r in result["ratings"]) == pytest.approx(0, abs=1e-6)
    assert all(r["stderr"] > 0 for r in result["ratings"])
    # Total wins equal total losses; per-player tallies agree with the matches.
    assert sum(r["wins"] for r in result["ratings"]) == sum(r["losses"] for r in result["ratings"])
    random_wins = sum(m["first_wins"] for m in result["matches"] if m["first"] == "random") + \
        sum(m["second_wins"] for m in result["matches"] if m["second"] == "random")
    assert ratings["random"]["wins"] == random_wins


def test_workers_give_the_same_results_as_one_process(league_run):
    env, players = resolve_players([str(league_run / "league" / "snapshots" / "a.safetensors"), "random",
                                    "tactical"])
    one = round_robin(env, players, games=5, seed=11, greedy=False)
    many = round_robin(env, players, games=5, seed=11, greedy=False, workers=2)
    assert one["matches"] == many["matches"] and one["ratings"] == many["ratings"]


def test_cli_tournament_prints_a_table_and_writes_json(league_run, tmp_path, capsys):
    out = tmp_path / "result.json"
    code = run.main(["evaluate", "--players", str(league_run / "checkpoints" / "latest.safetensors"), "tactical",
                     "minimax:1", "--games", "4", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    for name in ("alpha/main", "tactical", "minimax:1", "Elo"):
        assert name in printed
    result = json.loads(out.read_text())
    assert result["env"] == "tictactoe" and result["games_per_seat"] == 4 and result["greedy"] is True
    assert [p["name"] for p in result["players"]] == ["alpha/main", "tactical", "minimax:1"]
    assert result["players"][0]["step"] == 10 and len(result["matches"]) == 6
    assert result["elo"]["anchor"] == "mean rating 0"


@pytest.mark.parametrize("args, message", [
    (["--players", "random", "alphazero", "--env", "tictactoe"], "error: player 'alphazero': not a bot"),
    (["--players", "random", "missing.safetensors", "--env", "tictactoe"],
     "error: player 'missing.safetensors': no such checkpoint file or run directory"),
    (["--players", "random", "tactical"], "error: only bots were given"),
    (["--players", "random", "tactical", "--env", "tictactoe", "--opponent", "random"],
     "error: --opponent goes with --checkpoint"),
    (["--players", "random", "tactical", "--env", "tictactoe", "--workers", "0"], "error: --workers must be in"),
])
def test_cli_tournament_errors_exit_2_with_one_line(args, message, capsys):
    assert run.main(["evaluate", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


def test_cli_foreign_env_checkpoint_exits_2(league_run, tmp_path, capsys):
    c4 = write_checkpoint(tmp_path / "c4.safetensors", env="connect_four")
    assert run.main(["evaluate", "--players", str(league_run), str(c4), "--games", "1"]) == 2
    err = capsys.readouterr().err
    assert "players must all play one env" in err and "c4.safetensors" in err


def test_old_checkpoint_vs_opponent_form_takes_minimax(league_run, capsys):
    checkpoint = league_run / "checkpoints" / "latest.safetensors"
    assert run.main(["evaluate", "--checkpoint", str(checkpoint), "--opponent", "minimax:9", "--games", "5",
                     "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["opponent"] == "minimax:9"
    assert all(seat["wins"] == 0 for seat in result["seats"].values())  # perfect play never loses


def test_a_failing_worker_is_reported_with_its_pair(tmp_path):
    from impala_league.evaluation.tournament import TournamentError

    checkpoint = write_checkpoint(tmp_path / "gone.safetensors")
    env, players = resolve_players([str(checkpoint), "random"])
    checkpoint.unlink()  # vanishes after the parent checked it
    with pytest.raises(TournamentError, match=r"gone vs random: the worker process failed \(exit 2\): "
                                              r"error: checkpoint not found: .*gone.safetensors"):
        round_robin(env, players, games=1, workers=2)


def test_names_and_paths_starting_with_a_dash_reach_the_workers(tmp_path):
    # A file "-evil.safetensors" and a snapshot whose meta.id is "--a": their names must not be read as
    # options on a worker's command line.
    evil = write_checkpoint(tmp_path / "-evil.safetensors", seed=5)
    dashed = write_checkpoint(tmp_path / "snap.safetensors", meta={"id": "--a", "step": 3}, seed=6)
    env, players = resolve_players([str(evil), str(dashed), "random"])
    assert [p.name for p in players] == ["-evil", "--a", "random"]
    one = round_robin(env, players, games=1, seed=2)
    many = round_robin(env, players, games=1, seed=2, workers=2)
    assert one["matches"] == many["matches"] and {m["first"] for m in many["matches"]} == {"-evil", "--a", "random"}


def test_recorded_players_whose_names_give_one_file_name_keep_every_game(tmp_path):
    # "k9/main" and "k9_main" both become k9_main in file names; no replay may overwrite another.
    write_checkpoint(tmp_path / "k9" / "checkpoints" / "latest.safetensors", seed=7)
    write_checkpoint(tmp_path / "k9_main.safetensors", seed=8)
    env, players = resolve_players([str(tmp_path / "k9"), str(tmp_path / "k9_main.safetensors"), "random"])
    assert [p.name for p in players] == ["k9/main", "k9_main", "random"]
    record = tmp_path / "replays"
    result = round_robin(env, players, games=2, seed=0, record_dir=str(record))
    from impala_league.evaluation.replays import load_replay

    files = sorted(record.glob("*.json"))
    assert len(files) == 3 * 2 * 2 and not list(record.glob(".*"))  # 3 pairs, 2 seats, 2 games; no leftovers
    recorded = sorted(tuple(load_replay(f).players) for f in files)
    assert recorded == sorted((m["first"], m["second"]) for m in result["matches"] for _ in range(2))
    assert (record / "k9_main-vs-k9_main-0000.json").is_file() and (record / "k9_main-vs-k9_main-0000-2.json").is_file()
