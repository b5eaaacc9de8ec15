"""`run.py report`: one self-contained HTML page about run directories and compare outputs."""

from __future__ import annotations

import argparse
from pathlib import Path

from impala_league.analysis.report import build_report
from impala_league.config import ConfigError

NAME = "report"


def add_parser(sub, help: str) -> argparse.ArgumentParser:
    """The `report` command's parser, added to the subparsers `sub` of run.py."""
    p = sub.add_parser(NAME, help=help,
                       epilog='example: .venv/bin/python run.py report runs/connect_four_league',
                       description="Write one HTML file (plots embedded as PNG) about each RUN_DIR: the architecture "
                       "with the run's SPS, queue depth, policy lag and publish rate; learning curves; throughput; "
                       "the policy-lag histogram; V-trace diagnostics; league Elo and payoff where a league ran. "
                       "A `run.py compare` output folder adds its table and curves, then each of its runs.")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories and/or compare output folders")
    p.add_argument("--out", help="HTML file to write (default: RUN_DIR/report.html of the first one)")
    return p


def run(args: argparse.Namespace) -> int:
    """Write the HTML report of the run directories."""
    page = build_report(args.run_dirs)
    out = Path(args.out) if args.out else Path(args.run_dirs[0]) / "report.html"
    try:
        out.write_text(page)
    except OSError as e:
        raise ConfigError(f"cannot write {out}: {e.strerror}") from None
    print(f"wrote {out} ({len(page) / 1e6:.1f} MB)")
    return 0
