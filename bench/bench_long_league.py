"""A compressed week of league: a real `run.py train` league that snapshots every few updates until it
holds --snapshots snapshots, with what it takes printed over time.

The run: tictactoe, an MLP (`--hidden`, 256 by default: 0.28 MB of weights a snapshot), one learner and
its actors, a snapshot every `--every` updates, a manager pass every 0.05 s. Its Redis is started here
(appendonly, fsync every second, beside the run directory) so that its append-only file can be measured;
the run gets it with --redis-url. Every `--sample-s` seconds a line: seconds, snapshots (members),
snapshots whose weights Redis holds (its `{run}:league:snap:*` keys), Redis `used_memory` and its peak,
the append-only file's bytes on disk, the run directory's bytes, the manager's latest and longest pass,
its latest save, games scored, games against snapshots evicted before, loads from files, and errors
(ERROR lines of the run's output). At the end every snapshot file is read and checked (SHA-256).

    python bench/bench_long_league.py --bound 64 [--snapshots 2000] [--every 2] [--minutes 9]
    python bench/bench_long_league.py --bound 100000 --redis-aof-defaults   # the bound off: as before

`--bound` is `league.redis_snapshots`; with `--redis-aof-defaults` Redis keeps its own rewrite thresholds
(100 %, 64 MB) instead of the embedded Redis's (distributed/launch/embedded_redis.py). It stops the run (SIGTERM)
once the league holds --snapshots snapshots, or after --minutes. Run nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from impala_league.agents.checkpoint import CheckpointError, read_checkpoint  # noqa: E402
from impala_league.distributed.launch.launcher import EmbeddedRedis  # noqa: E402
from impala_league.distributed.wire.transport import connect  # noqa: E402
from impala_league.league.usage import tree_bytes  # noqa: E402

MB = 2**20
COLUMNS = ("s", "snapshots", "in_redis", "redis_MB", "peak_MB", "aof_MB", "run_dir_MB", "pass_ms", "max_pass_ms",
           "save_ms", "games", "vs_evicted", "loads", "errors")


def train_command(args, run_dir: Path, url: str) -> list[str]:
    sets = [f"run.name={run_dir.name}", f"run.dir={run_dir.parent}", "run.total_agent_steps=1000000000",
            f"run.max_minutes={args.minutes + 1}", "run.wandb_mode=disabled", "run.log_every_s=10",
            "env.name=tictactoe", "agent.torso=mlp", f"agent.hidden={args.hidden}", "actor.num_actors=1",
            "actor.num_envs=16", "actor.unroll_length=8", "actor.epsilon=0.3", "learner.batch_size=8",
            "league.enabled=true", "league.bots=[random]", f"league.snapshot_every={args.every}",
            "league.manager_every_s=0.05", f"league.redis_snapshots={args.bound}",
            f"league.opponent_cache={min(16, args.bound)}"]
    config = run_dir.parent / "bench_long_league.yaml"  # the defaults; the settings above override them
    config.write_text("env:\n  name: tictactoe\n")
    return [sys.executable, str(REPO / "run.py"), "train", "--config", str(config), "--redis-url", url,
            "--eval-games", "0", *[a for s in sets for a in ("--set", s)]]


def sample(client, run: str, run_dir: Path, aof: Path, start: float, errors: int) -> dict:
    """One line of the table (see the module docstring)."""
    try:
        state = json.loads((run_dir / "league" / "state.json").read_text())
    except (OSError, ValueError):
        state = {}
    memory = client.info("memory")
    members = state.get("members", {})
    return {"s": time.monotonic() - start,
            "snapshots": sum(1 for m in members.values() if m.get("kind") == "snapshot"),
            "in_redis": sum(1 for k in client.scan_iter(match=f"{run}:league:snap:*", count=1000)
                            if not k.endswith(b":sha256")),
            "redis_MB": memory["used_memory"] / MB, "peak_MB": memory["used_memory_peak"] / MB,
            "aof_MB": aof.stat().st_size / MB if aof.exists() else 0.0, "run_dir_MB": tree_bytes(run_dir) / MB,
            "pass_ms": 1000 * state.get("pass_s", 0.0), "max_pass_ms": 1000 * state.get("pass_s_max", 0.0),
            "save_ms": 1000 * state.get("save_s", 0.0), "games": state.get("games", 0),
            "vs_evicted": state.get("evicted_games", 0), "loads": state.get("residency", {}).get("loads", 0),
            "errors": errors}


def print_row(row: dict) -> None:
    print("| " + " | ".join(f"{row[c]:.0f}" if isinstance(row[c], float) and c not in ("redis_MB", "peak_MB", "aof_MB",
                                                                                      "run_dir_MB")
                            else f"{row[c]:.1f}" if isinstance(row[c], float) else str(row[c]) for c in COLUMNS)
          + " |", flush=True)


def count_errors(stream, log_path: Path, counter: list[int]) -> None:
    """Copy the run's output to `log_path`, counting its ERROR lines."""
    with log_path.open("w") as f:
        for line in stream:
            f.write(line)
            if " ERROR " in line or line.startswith("ERROR") or "Traceback" in line:
                counter[0] += 1


def follow(args, proc: subprocess.Popen, client, run_dir: Path, aof: Path, errors: list[int]) -> int:
    """Print a line every --sample-s until the league holds --snapshots snapshots or --minutes passed, then
    stop the run (SIGTERM). Returns the most snapshots Redis held at once (looked at every second)."""
    start = next_sample = time.monotonic()
    most_in_redis = 0
    while proc.poll() is None:
        time.sleep(1.0)
        row = sample(client, run_dir.name, run_dir, aof, start, errors[0])
        most_in_redis = max(most_in_redis, row["in_redis"])
        if time.monotonic() >= next_sample or row["snapshots"] >= args.snapshots:
            next_sample += args.sample_s
            print_row(row)
        if row["snapshots"] >= args.snapshots or time.monotonic() - start > args.minutes * 60:
            proc.send_signal(signal.SIGTERM)
            break
    proc.wait(timeout=120)
    final = sample(client, run_dir.name, run_dir, aof, start, errors[0])
    print_row(final)
    return most_in_redis


def summary(args, client, run_dir: Path, aof: Path, most_in_redis: int, errors: int, code: int) -> None:
    """The last line: every snapshot file read and checked, the peaks, the counts."""
    files = sorted((run_dir / "league" / "snapshots").glob("*.safetensors"))
    bad = []
    for path in files:
        try:
            read_checkpoint(path)
        except CheckpointError as e:
            bad.append(str(e))
    row = sample(client, run_dir.name, run_dir, aof, time.monotonic(), errors)
    try:
        state = json.loads((run_dir / "league" / "state.json").read_text())
    except OSError:
        print(f"\nthe run wrote no league state (exit {code}); its output:\n"
              + (run_dir.parent / "train.log").read_text()[-3000:])
        return
    print(f"\nsnapshots {row['snapshots']} (files {len(files)}, unreadable {len(bad)}); most in Redis at once "
          f"{most_in_redis} (bound {args.bound}); peak Redis {row['peak_MB']:.1f} MB; AOF {row['aof_MB']:.1f} MB; "
          f"run dir {row['run_dir_MB']:.1f} MB; longest pass {1000 * state.get('pass_s_max', 0):.0f} ms; games "
          f"{row['games']}, against evicted snapshots {row['vs_evicted']}; loads {row['loads']}; errors {errors}; "
          f"exit {code}")
    for e in bad[:5]:
        print("  ", e)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bound", type=int, default=64, help="league.redis_snapshots")
    p.add_argument("--snapshots", type=int, default=2000)
    p.add_argument("--every", type=int, default=2, help="league.snapshot_every (updates)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--minutes", type=float, default=9.0)
    p.add_argument("--sample-s", type=float, default=20.0)
    p.add_argument("--redis-aof-defaults", action="store_true", help="Redis's own AOF rewrite thresholds")
    p.add_argument("--out", type=Path, default=None, help="keep the run here (default: a temporary folder)")
    args = p.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="bench-long-league-"))
    run_dir = root / f"long-league-{args.bound}-{int(time.time())}"
    try:
        with EmbeddedRedis(root / "redis") as server:
            client = connect(server.url)
            if args.redis_aof_defaults:
                client.config_set("auto-aof-rewrite-percentage", 100)
                client.config_set("auto-aof-rewrite-min-size", 64 * MB)
            aof = Path(server.dir) / "appendonly.aof"
            print(f"bound {args.bound}, target {args.snapshots} snapshots, every {args.every} updates, hidden "
                  f"{args.hidden}, AOF rewrite {client.config_get('auto-aof-rewrite-percentage')}, run {run_dir}\n")
            print("| " + " | ".join(COLUMNS) + " |\n|" + "---:|" * len(COLUMNS), flush=True)
            proc = subprocess.Popen(train_command(args, run_dir, server.url), cwd=REPO, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
            errors = [0]
            copier = threading.Thread(target=count_errors, args=(proc.stdout, root / "train.log", errors), daemon=True)
            copier.start()
            most_in_redis = follow(args, proc, client, run_dir, aof, errors)
            copier.join(timeout=10)
            summary(args, client, run_dir, aof, most_in_redis, errors[0], proc.returncode)
            client.close()
    finally:
        if args.out is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
