"""Policy networks (torsos, heads, action masking) and trained policies.

`from impala_league.agents import load_policy` gives `agents.policy.load_policy`: a checkpoint's policy, played
without Redis. It is imported on first use, so importing a network module stays light.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Policy", "load_policy"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from impala_league.agents import policy

        return getattr(policy, name)
    raise AttributeError(f"module 'agents' has no attribute {name!r}")
