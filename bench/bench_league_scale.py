"""The league manager's pass and its saved state at 10, 100, 1,000 and 5,000 players, on this machine.

For each size N the bench builds a league of N snapshots (main 60%, a main exploiter and a league
exploiter 20% each; files on disk, every learner with a payoff record against every snapshot, per seat
too; Elo for all) plus two bots, on a private Redis, then times manager passes as `LeagueManager.one_pass`
makes them: `results` (RESULTS episode results read and scored), `snapshot` (one new snapshot of the
main agent: file, Redis), `pfsp` (the three learners' opponent distributions, published), `residency`
(the snapshots Redis holds: `league.redis_snapshots` = 64; WANTS actors' asks, so up to 8 loads from
files), `pass` (those four), and `save` (state.json,
ratings.jsonl; `one_pass` saves at most every save_s / SAVE_DUTY seconds). Then the
state's size, a `--resume` (state read, files checked) plus the first pass's fill of Redis, and the
report's league figures (Elo over time from a ratings.jsonl of 100 lines, the payoff heatmap).

    python bench/bench_league_scale.py [--sizes 10 100 1000 5000] [--passes 5] [--results 500] [--wants 20]

Prints a markdown table: the median and the slowest pass of each part (ms), the state's MB, resume s,
figures s. The issue's bar: no pass over 1 s at 5,000 players; a state that loads in seconds.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import msgpack  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from impala_league.agents.network import ActorCritic  # noqa: E402
from impala_league.analysis.report import league_figures  # noqa: E402
from impala_league.analysis.runs import Run  # noqa: E402
from impala_league.config import load_config  # noqa: E402
from impala_league.distributed.launch.launcher import EmbeddedRedis  # noqa: E402
from impala_league.distributed.wire.params import ParamStore  # noqa: E402
from impala_league.envs.registry import env_spec  # noqa: E402
from impala_league.league.manager import LeagueManager  # noqa: E402
from impala_league.league.payoff import Rating, Record  # noqa: E402
from impala_league.league.players import namespace, role  # noqa: E402
from impala_league.league.state import Member  # noqa: E402

LEARNERS = ("main", "main_exploiter_0", "league_exploiter_0")
PARTS = ("results", "snapshot", "pfsp", "residency", "pass", "save")


def config(root: Path, name: str):
    return load_config(None, [f"run.name={name}", f"run.dir={root}", "env.name=tictactoe", "agent.torso=mlp",
                              "agent.hidden=16", "league.enabled=true", "league.main_exploiters=1",
                              "league.league_exploiters=1", "league.bots=[random,tactical]", "league.snapshot_every=1",
                              "league.redis_snapshots=64", "run.wandb_mode=disabled"])


def build(cfg, url: str, run_dir: Path, n: int, rng: np.random.Generator) -> LeagueManager:
    """A manager whose league holds `n` snapshots with files, payoff records and ratings."""
    manager = LeagueManager(cfg, url, run_dir)
    spec = env_spec(cfg.env.name)
    weights = ActorCritic(spec.obs_shape, spec.num_actions, cfg.agent).state_dict()
    ParamStore(manager.redis, cfg.run.name).publish(weights, 1)
    first = manager.take_snapshot("main", "bench")  # a real file, copied for the others
    source = manager.residency.path(first)
    now = time.time()
    for k in range(1, n):
        player = LEARNERS[0] if k % 5 < 3 else LEARNERS[1 + k % 5 % 2]
        snapshot_id = f"{player}-{k + 1:07d}"
        shutil.copyfile(source, manager.residency.path(snapshot_id))
        manager.state.members[snapshot_id] = Member(snapshot_id, "snapshot", role(player), player, k + 1, 0, None,
                                                    now - n + k)
    for s in manager.state.snapshots():
        manager.state.elo.ratings[s] = Rating(float(rng.normal(0, 200)), 10.0)
        for p in LEARNERS:
            w, d, l = rng.integers(0, 15, 3).astype(float)
            manager.state.payoff.records[(p, s)] = Record(w, d, l)
            manager.state.payoff.records[(s, p)] = Record(l, d, w)
            for seat in (0, 1):
                manager.state.payoff.seat_records[(p, s, seat)] = Record(w / 2, d / 2, l / 2)
    manager.state.payoff.seats.update((0, 1))
    manager.state.last_snapshot = {p: 1 for p in LEARNERS}
    return manager


def post_results(manager: LeagueManager, count: int, rng: np.random.Generator) -> None:
    snapshots = manager.state.snapshots()
    pipe = manager.redis.pipeline(transaction=False)
    for _ in range(count):
        opponent = snapshots[rng.integers(len(snapshots))]
        pipe.xadd(manager.results.key, {"data": msgpack.packb(
            {"player": "main", "opponent_id": opponent, "opponent_version": opponent, "learner_seat": int(rng.integers(2)),
             "winner": int(rng.integers(-1, 2)), "length": 20, "returns": [0.0, 0.0]})})
    pipe.execute()


def timed_pass(manager: LeagueManager, version: int, results: int, wants: int,
               rng: np.random.Generator) -> dict[str, float]:
    """One pass of `LeagueManager.one_pass`, each part timed (seconds), after `results` results and
    `wants` actors' asks for random snapshots."""
    post_results(manager, results, rng)
    snapshots = manager.state.snapshots()
    for k in rng.choice(len(snapshots), size=min(wants, len(snapshots)), replace=False):
        manager.store.want(snapshots[k])
    ParamStore(manager.redis, namespace(manager.cfg.run.name, "main")).publish(
        manager.params["main"].fetch()[1], version)
    out = {}
    for part, step in (("results", manager.consume_results), ("snapshot", manager.snapshot_due_learners),
                       ("pfsp", manager.publish), ("residency", manager.rebalance_snapshots), ("save", manager.save)):
        t = time.perf_counter()
        step()
        out[part] = time.perf_counter() - t
    out["pass"] = sum(out[p] for p in ("results", "snapshot", "pfsp", "residency"))
    return out


def figures_seconds(cfg, run_dir: Path, manager: LeagueManager) -> float:
    """Seconds to draw the report's league figures from 100 ratings lines and the saved state."""
    line = json.dumps({"time": time.time(), "games": 0, "elo": {m: r.elo for m, r in manager.state.elo.ratings.items()}})
    (run_dir / "league" / "ratings.jsonl").write_text((line + "\n") * 100)
    start = time.perf_counter()
    figs = league_figures(Run(run_dir, cfg, [], time.time() - 100))
    seconds = time.perf_counter() - start
    import matplotlib.pyplot as plt

    for fig in figs:
        plt.close(fig)
    return seconds


def measure(n: int, passes: int, results: int, wants: int, url: str, root: Path) -> dict:
    rng = np.random.default_rng(n)
    name = f"scale-{n}"
    cfg = config(root, name)
    run_dir = root / name
    manager = build(cfg, url, run_dir, n, rng)
    manager.consume_results()  # the group, at the stream's end
    manager.publish()
    manager.rebalance_snapshots()
    runs = [timed_pass(manager, 10_000_000 + k, results, wants, rng) for k in range(passes)]  # ids apart from the built ones
    state_mb = (run_dir / "league" / "state.json").stat().st_size / 2**20
    start = time.perf_counter()
    resumed = LeagueManager(cfg, url, run_dir, resume=True)
    resumed.redis.delete(*resumed.redis.keys(f"{name}:league:snap:*") or ["-"], f"{name}:league:resident")
    loaded = time.perf_counter()
    resumed.publish()
    resumed.rebalance_snapshots(fill=True)
    filled = time.perf_counter()
    row = {"players": len(manager.state.members), "state_mb": state_mb, "resume_s": loaded - start,
           "fill_s": filled - loaded, "figures_s": figures_seconds(cfg, run_dir, manager)}
    for part in PARTS:
        values = [r[part] for r in runs]
        row[part] = (statistics.median(values) * 1000, max(values) * 1000)
    manager.redis.close()
    resumed.redis.close()
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000, 5000])
    p.add_argument("--passes", type=int, default=5)
    p.add_argument("--results", type=int, default=500, help="episode results scored per pass")
    p.add_argument("--wants", type=int, default=20, help="actors' asks for evicted snapshots per pass")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="bench-league-scale-"))
    try:
        with EmbeddedRedis(appendonly=False) as server:
            rows = [measure(n, args.passes, args.results, args.wants, server.url, root) for n in args.sizes]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nmanager pass, ms (median / slowest of {args.passes}); {args.results} results and {args.wants} asks "
          "for evicted snapshots per pass\n")
    print("| players | " + " | ".join(PARTS) + " | state.json MB | resume s | fill Redis s | figures s |")
    print("|---:|" + "---:|" * (len(PARTS) + 4))
    for r in rows:
        print(f"| {r['players']} | " + " | ".join(f"{r[p][0]:.1f} / {r[p][1]:.1f}" for p in PARTS)
              + f" | {r['state_mb']:.2f} | {r['resume_s']:.2f} | {r['fill_s']:.2f} | {r['figures_s']:.2f} |")


if __name__ == "__main__":
    main()
