"""The pysc2 shim: pysc2 imports on this Python and protobuf, and only SC2 code paths are affected."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from impala_league import REPO


def _run(code: str, env: dict | None = None) -> dict:
    """Run `code` in a fresh interpreter from the repo root; it prints one JSON line."""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_pysc2_imports_from_a_clean_interpreter_and_builds_its_palettes():
    result = _run(
        "import json, os, sys\n"
        "before = os.environ.get('PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION')\n"
        "import impala_league.envs.sc2_wrappers\n"
        "from pysc2.lib import colors, features\n"
        "from pysc2.env import mock_sc2_env\n"
        "from google.protobuf.internal import api_implementation\n"
        "print(json.dumps({'before': before, 'impl': api_implementation.Type(),\n"
        "  'after': os.environ.get('PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION'),\n"
        "  'hue': colors.shuffled_hue(4).round(3).tolist(),\n"
        "  'smooth': colors.smooth_hue_palette(4).round(3).tolist(),\n"
        "  'screen_layers': len(features.SCREEN_FEATURES), 'skvideo': 'skvideo' in sys.modules}))\n")
    # The process runs pure-Python protobuf; the variable is put back, so its children start clean.
    assert result["before"] is None and result["after"] is None and result["impl"] == "python"
    assert result["screen_layers"] == 27
    assert not result["skvideo"]  # pysc2's video writer (and sk-video, scipy.signal) load on first use only
    # Python 3.10's shuffle with random() = 0.5 on [h0, h1, h2, h3]: i=3 swaps 3<->floor(2.0)=2,
    # i=2 swaps 2<->floor(1.5)=1, i=1 swaps 1<->floor(1.0)=1: [h0, h3, h1, h2].
    smooth = result["smooth"]
    assert result["hue"] == [smooth[0], smooth[3], smooth[1], smooth[2]]
    assert smooth[0] != smooth[3]


def test_rest_of_the_project_does_not_import_pysc2_or_switch_protobuf():
    result = _run(
        "import json, os, sys\n"
        "import run, impala_league.config, impala_league.envs.registry, impala_league.distributed.actor\n"
        "import impala_league.distributed.learner.role, impala_league.agents.network\n"
        "import google.protobuf\n"
        "from google.protobuf.internal import api_implementation\n"
        "print(json.dumps({'pysc2': any(m.startswith('pysc2') for m in sys.modules),\n"
        "  'env': os.environ.get('PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION'), 'impl': api_implementation.Type()}))\n")
    assert result == {"pysc2": False, "env": None, "impl": "upb"}


def test_importing_after_fast_protobuf_is_a_clear_error():
    out = subprocess.run([sys.executable, "-c", "import google.protobuf.message\nimport impala_league.envs.sc2_wrappers"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "before anything that imports protobuf" in out.stderr


def test_missing_game_names_the_folder_and_sc2path(tmp_path, monkeypatch):
    from impala_league.envs.sc2_wrappers.compat import SC2NotInstalledError, require_game

    monkeypatch.setenv("SC2PATH", str(tmp_path / "nowhere"))
    with pytest.raises(SC2NotInstalledError, match="SC2PATH=.*nowhere.*set SC2PATH"):
        require_game()
    (tmp_path / "sc2" / "Versions" / "Base75689").mkdir(parents=True)
    monkeypatch.setenv("SC2PATH", str(tmp_path / "sc2"))
    with pytest.raises(SC2NotInstalledError, match="no Versions/Base\\*/SC2_x64"):
        require_game()
    (tmp_path / "sc2" / "Versions" / "Base75689" / "SC2_x64").write_bytes(b"")
    (tmp_path / "sc2" / "Maps").mkdir()
    assert require_game() == tmp_path / "sc2"


def test_training_without_the_game_stops_before_anything_starts(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"}
    env["SC2PATH"] = str(tmp_path / "no-game")
    runs = tmp_path / "runs"
    out = subprocess.run([sys.executable, "run.py", "train", "--config", "configs/sc2_move_to_beacon.yaml",
                          "--set", f"run.dir={runs}"], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("error: sc2:MoveToBeacon: StarCraft II is not installed where pysc2 looks: no folder "
                                 f"SC2PATH={tmp_path / 'no-game'}")
    assert "set SC2PATH to that folder" in out.stderr and "Traceback" not in out.stderr
    assert not runs.exists()  # no run directory, no Redis, no learner or actor
