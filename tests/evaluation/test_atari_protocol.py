"""The Atari evaluation protocol: what it plays, what evaluation.json keeps of it, and what it refuses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from impala_league.agents.policy import load_policy
from impala_league.config import ConfigError, load_config
from impala_league.evaluation.atari_protocol import (PROTOCOLS, ProtocolError, evaluate_atari, protocol_kwargs,
                                                     returns_summary, summary_text)
from impala_league.envs.atari import make_atari
from tests.evaluation.test_atari_judge import write_checkpoint

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pong(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("protocol") / "pong.safetensors", "atari:Pong")


def test_the_protocols_set_sticky_actions_whatever_the_policy_trained_with():
    trained = {"emulator": "ale_vector", "emulator_threads": 2, "sticky_actions": 0.0, "noop_max": 0}
    sticky = protocol_kwargs("atari:Pong", trained)
    assert sticky["sticky_actions"] == 0.25 and sticky["noop_max"] == 30 and sticky["emulator"] == "gymnasium"
    assert "emulator_threads" not in sticky and protocol_kwargs("atari:Pong", trained, "deterministic")["sticky_actions"] == 0
    env = make_atari("Pong", sticky)
    assert env.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)
    # The config's choices are the protocols.
    assert load_config(None, ["evaluation.atari_protocol=deterministic"]).evaluation.atari_protocol == "deterministic"
    with pytest.raises(ConfigError, match="atari_protocol must be sticky or deterministic"):
        load_config(None, ["evaluation.atari_protocol=machado"])
    assert tuple(PROTOCOLS) == ("sticky", "deterministic")


def test_a_protocol_the_env_cannot_give_is_refused():
    with pytest.raises(ProtocolError, match="tictactoe has no sticky actions"):
        protocol_kwargs("tictactoe", {})
    with pytest.raises(ProtocolError, match="env.kwargs.frame_skip=3; the sticky protocol plays frame_skip=4"):
        protocol_kwargs("atari:Pong", {"frame_skip": 3})
    with pytest.raises(ProtocolError, match="valid: sticky, deterministic"):
        protocol_kwargs("atari:Pong", {}, "machado")


def test_returns_summary_by_hand():
    s = returns_summary([21.0, 19.0, 21.0, 15.0])
    # mean 19, sample std sqrt(((2)^2 + 0 + 2^2 + 4^2) / 3) = sqrt(8), t(0.975, 3) = 3.182446
    assert s["mean_return"] == 19.0 and s["distinct_returns"] == 3
    assert s["interval"] == pytest.approx(3.182446 * 8 ** 0.5 / 2, rel=1e-5)
    assert returns_summary([-21.0])["interval"] is None
    assert summary_text({**s, "greedy": True, "games": 4}) == \
        "greedy: mean return +19.0 ± 4.5 (min +15, max +21, 3 distinct of 4 games)"


def test_evaluate_plays_greedy_then_sampled_under_the_protocol_and_reruns_agree(pong):
    first = evaluate_atari(load_policy(pong, seed=1), 2, seed=5)
    assert first == evaluate_atari(load_policy(pong, seed=1), 2, seed=5)
    assert first["protocol"]["name"] == "sticky" and first["protocol"]["games"] == 2
    for mode in ("greedy", "sampled"):
        r = first[mode]
        assert r["games"] == 2 and len(r["returns"]) == 2 and r["mean_return"] == sum(r["returns"]) / 2
    assert first["greedy"]["greedy"] and not first["sampled"]["greedy"]


def _evaluate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "run.py"), "evaluate", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=120)


def test_run_py_evaluate_names_the_protocol_and_refuses_it_for_a_board_game(pong, tmp_path):
    out = tmp_path / "e.json"
    done = _evaluate("--checkpoint", str(pong), "--games", "2", "--protocol", "deterministic", "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "atari:Pong: 2 games, deterministic protocol (sticky actions 0.0" in done.stdout
    assert "greedy: mean return" in done.stdout and "sampled: mean return" in done.stdout
    record = json.loads(out.read_text())
    assert record["protocol"]["sticky_actions"] == 0.0 and record["checkpoint"] == str(pong)
    board = write_checkpoint(tmp_path / "c4.safetensors", "connect_four")
    refused = _evaluate("--checkpoint", str(board), "--protocol", "sticky")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip().count("\n") == 0 and "connect_four has no sticky actions" in refused.stderr


def test_the_end_of_run_evaluation_plays_a_policy_the_protocol_cannot_in_its_own_game(tmp_path, caplog):
    from impala_league.evaluation.final import play_alone

    skip3 = load_policy(write_checkpoint(tmp_path / "skip3.safetensors", "atari:Pong", "env.kwargs.frame_skip=3"))
    record = {}
    play_alone(skip3.config, skip3, 1, record)
    assert "protocol" not in record and record["episodes"]["episodes"] == 1
    assert "not evaluated under the sticky protocol" in caplog.text
