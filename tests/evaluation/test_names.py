"""What a misspelled bot, a run directory given as --checkpoint and a count of one print."""

from __future__ import annotations

import pytest

from impala_league.checked_config import load_config
from impala_league.cli.evaluate import checkpoint_file
from impala_league.config import ConfigError
from impala_league.evaluation.bots import make_bot
from impala_league.evaluation.tournament import PlayerError, resolve_players
from impala_league.text import plural


@pytest.mark.parametrize("spec, meant", [("tactcal", "tactical"), ("minimx:2", "minimax:2"), ("mcst:100", "mcts:100"),
                                         ("solvr", "solver")])
def test_a_misspelled_bot_or_judge_names_the_one_meant(spec, meant):
    with pytest.raises(ValueError, match=f"did you mean '{meant}'"):
        make_bot(spec, "connect_four")
    with pytest.raises(PlayerError, match=f"did you mean '{meant}'"):
        resolve_players([spec, "random"], "connect_four")


def test_a_misspelled_league_bot_or_judge_in_the_config_names_the_one_meant():
    with pytest.raises(ConfigError, match=r"league.bots: unknown bot spec 'tactcal' \(did you mean 'tactical'\?\)"):
        load_config(None, ["env.name=connect_four", "league.enabled=true", "league.bots=[random, tactcal]"])
    with pytest.raises(ConfigError, match=r"evaluation.judges: .*did you mean 'mcts:400'"):
        load_config(None, ["env.name=connect_four", "evaluation.judges=[mcst:400]"])
    with pytest.raises(ValueError) as e:
        make_bot("xyz", "connect_four")
    assert "did you mean" not in str(e.value)  # nothing close: only the valid forms


def test_checkpoint_takes_a_run_directory(tmp_path):
    latest = tmp_path / "run" / "checkpoints" / "latest.safetensors"
    latest.parent.mkdir(parents=True)
    latest.write_bytes(b"")
    assert checkpoint_file(str(tmp_path / "run")) == str(latest)
    assert checkpoint_file(str(latest)) == str(latest)
    assert checkpoint_file("missing.safetensors") == "missing.safetensors"  # load_policy names a missing file
    with pytest.raises(ConfigError, match="without checkpoints/latest.safetensors"):
        checkpoint_file(str(tmp_path))


def test_one_game_is_one_game():
    assert [plural(n, "game") for n in (0, 1, 2)] == ["0 games", "1 game", "2 games"]
    assert plural(1, "earlier policy", "earlier policies") == "1 earlier policy"
    assert plural(3, "earlier policy", "earlier policies") == "3 earlier policies"
