"""A StarCraft II config on pysc2's mock env (no game needed), as the FullyConv tests build it."""

from __future__ import annotations

import pytest


def mock_sc2_config(core: str):
    """The checked config of a FullyConv network (hidden 16, core `core`: none or lstm of size 6) on
    sc2:MoveToBeacon's mock env with 8x8 screen and minimap; skips the test where pysc2 is missing."""
    pytest.importorskip("pysc2")
    import impala_league.envs.sc2_wrappers  # noqa: F401  (pysc2 through the shim)
    from impala_league.checked_config import load_config

    return load_config(None, ["env.name=sc2:MoveToBeacon", "env.kwargs={mock: true, screen_size: 8, minimap_size: 8}",
                              "agent.torso=fullyconv", "league.bots=[]", "agent.hidden=16", f"agent.core={core}",
                              "agent.core_size=6"])
