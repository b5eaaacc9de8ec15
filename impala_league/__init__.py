"""impala-league: distributed IMPALA with V-trace for multi-agent games.

The layers, lowest first (docs/architecture.md): config and tracking (plain data), losses (the math of
learning), envs (games), agents (networks), the roles (distributed, league, evaluation, analysis,
experiment) and the command line (cli; run.py at the checkout's root dispatches to it).
"""

from pathlib import Path

# The checkout this package sits in: run.py, which the launcher starts each role with, and configs/.
REPO = Path(__file__).resolve().parent.parent
