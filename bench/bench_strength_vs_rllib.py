"""Connect four at equal minutes: our main command's league against RLlib's own self-play example, both final
policies judged by the same held-out judges.

    .venv/bin/python bench/bench_strength_vs_rllib.py [--minutes 15] [--ours RUN_DIR] [--json PATH] [--out DIR]

Example: an existing run of ours beside 15 minutes of RLlib (RLlib's start-up and stop add about half a
minute; then the judges, of which mcts:1600 is the slowest, its time growing with --games):

    .venv/bin/python bench/bench_strength_vs_rllib.py --ours runs/connect_four_league --json runs/vs_rllib.json

RLlib. Its example rllib/examples/multi_agent/self_play_with_open_spiel.py, unmodified, run from the
installed wheel (`python -m ray.rllib.examples.multi_agent.self_play_with_open_spiel`; its league-based
sibling, self_play_league_based_with_open_spiel.py, is not run here): PPO with num_epochs 20 and RLlib's
default MLP (fcnet_hiddens [512, 512], tanh; policy and value heads on one encoder) on OpenSpiel's
connect_four through RLlib's OpenSpielEnv, which hands the mover `state.observation_tensor()` and, for an
illegal move, plays a random legal one and gives the mover -0.1 (no action mask in training). Its "main"
module plays a random module until its win rate passes 0.95, then frozen snapshots of itself (main_v1,
main_v2, ...). The bench gives the example these flags:

    --num-env-runners 1 --num-cpus 2    (Ray counts a CPU for the trial and one a runner: this machine's 2
                                         cores; --env-runners K gives K runners and --num-cpus max(cores, K + 1))
    --checkpoint-freq 1 --checkpoint-at-end   (the example's own defaults: a checkpoint every iteration)
    --stop-iters 1000000 --stop-timesteps 1000000000000 --min-league-size 1000000   (no stop but the time)
    --num-episodes-human-play 0         (no games against a human on the terminal at the end)
    --verbose 1

and HOME set to the run's folder, so that Tune's ~/ray_results lies there. The example has no time limit: once
the trial's first result says when training began (its timestamp less its time_total_s), the bench sends
SIGINT to the script at that time plus --minutes (Tune then stops the trial and saves its state) and judges
the newest checkpoint, that of the last whole iteration before the deadline: its time_total_s is the table's
minutes. bench/rllib_policy.py exports that checkpoint's "main" policy, in RLlib's venv, to safetensors and
JSON (no pickle crosses the venvs; the older checkpoints, about 4 MB each, are then deleted), and it is
loaded here as a player: our observation becomes OpenSpiel's observation tensor, and its move is the argmax
of its logits over the legal columns (greedy, as ours is judged).

RLlib's venv: on first use this script creates bench/.venv-rllib (git-ignored) and pip-installs `PINS` into
it from the configured package index: ray[rllib] 2.60.0 and this venv's versions of torch (the CPU wheel),
open_spiel, safetensors (for the export) and pillow (the example's lookup of PPO registers every algorithm,
and DreamerV3's module imports PIL, which ray[rllib] does not install). A marker file records the pins;
change them and the next run reinstalls.

Ours. `run.py train --config configs/connect_four_league.yaml --set run.max_minutes=MINUTES` (wandb off, no
end-of-run evaluation), or with --ours RUN_DIR an existing run's checkpoints/latest.safetensors (no training).

The judges, the same for both (impala_league/evaluation): the solver's --positions positions of seed
--positions-seed (optimal and blunder rates over the positions not already lost; evaluation/positions.py),
and --games games a seat against each of --judges (default mcts:400 and mcts:1600) from seed --judges-seed,
seats pooled (win + draw / 2): the games `run.py evaluate --opponent J --games G --seed S` plays for a
checkpoint, which evaluation/foreign.py plays for RLlib's policy too. The table puts ours beside RLlib's:
training minutes (start-up left out on both sides), agent steps (the learning side's moves: ours trained,
RLlib's "main" sampled, each of which PPO trains on for its epochs), env steps (the moves of both seats),
trainable parameters (value head included), and each judgement.

Each run should have the machine to itself: run nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from importlib.metadata import version
from multiprocessing import get_context
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import numpy as np  # noqa: E402
import psutil  # noqa: E402

from bench_vs_sample_factory import TreeMonitor  # noqa: E402

CONFIG = REPO / "configs" / "connect_four_league.yaml"
RLLIB_VENV = REPO / "bench" / ".venv-rllib"
EXPORTER = REPO / "bench" / "rllib_policy.py"
RAY_VERSION = "2.60.0"
PINS = [f"ray[rllib]=={RAY_VERSION}", f"torch=={version('torch')}", f"open_spiel=={version('open_spiel')}",
        f"safetensors=={version('safetensors')}", f"pillow=={version('pillow')}"]
EXAMPLE = "ray.rllib.examples.multi_agent.self_play_with_open_spiel"
START_S = 600  # seconds RLlib may take from launch to its first result
STOP_S = 180  # seconds RLlib may take to stop after SIGINT, then what is left of its process tree is killed


def ensure_rllib_venv(venv: Path = RLLIB_VENV) -> Path:
    """The python of RLlib's virtual environment `venv`, created and filled with `PINS` first when missing
    or installed with other pins (its `.bench-pins` marker says which)."""
    python, marker = venv / "bin" / "python", venv / ".bench-pins"
    if python.exists() and marker.exists() and marker.read_text().split("\n") == PINS:
        return python
    print(f"creating {venv} with {' '.join(PINS)}", flush=True)
    started = time.time()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *PINS], check=True)
    marker.write_text("\n".join(PINS))
    print(f"installed in {time.time() - started:.0f} s", flush=True)
    return python


def rllib_command(python: Path, env_runners: int) -> list[str]:
    """The example's command line (the module docstring's flags)."""
    cpus = max(os.cpu_count() or 1, env_runners + 1)
    return [str(python), "-m", EXAMPLE, "--num-env-runners", str(env_runners), "--num-cpus", str(cpus),
            "--checkpoint-freq", "1", "--checkpoint-at-end", "--stop-iters", "1000000",
            "--stop-timesteps", "1000000000000", "--min-league-size", "1000000",
            "--num-episodes-human-play", "0", "--verbose", "1"]


def first_result(storage: Path) -> dict | None:
    """The first line of the trial's result.json under `storage`, once one is written whole."""
    for path in storage.rglob("result.json"):
        line, newline, _ = path.read_text().partition("\n")
        if newline:
            return json.loads(line)
    return None


def end_tree(proc: subprocess.Popen, monitor: TreeMonitor):
    """After the example exits (or is given up on: then it is killed), stop sampling its tree and kill each
    process of it seen that is still there (Ray's workers and servers, all started by this script), by pid
    and start time; the tree's usage."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    usage = monitor.stop()
    for pid, created in monitor.cpu:
        try:
            p = psutil.Process(pid)
            if p.create_time() == created:
                p.kill()
        except psutil.NoSuchProcess:
            pass
    return usage


def run_rllib(minutes: float, out: Path, python: Path, env_runners: int) -> dict:
    """RLlib's example for `minutes` of training in `out` (its HOME), then its policy exported to
    `out`/policy; the export's meta (bench/rllib_policy.py), with the launch's times."""
    home, storage = out / "home", out / "home" / "ray_results"
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HOME=str(home), RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)  # nothing of this venv in RLlib's
    cmd = rllib_command(python, env_runners)
    log = out / "rllib.log"
    print(f"RLlib: {' '.join(cmd[1:])}  (log {log})", flush=True)
    with log.open("w") as stream:
        launched = time.time()
        proc = subprocess.Popen(cmd, cwd=out, stdout=stream, stderr=subprocess.STDOUT, env=env)
        monitor = TreeMonitor(proc.pid)
        try:
            first = None
            while first is None and proc.poll() is None and time.time() < launched + START_S:
                time.sleep(2)
                first = first_result(storage)
            if first is None:
                raise SystemExit(f"RLlib gave no result in {time.time() - launched:.0f} s (exit status "
                                 f"{proc.poll()}); the end of {log}:\n{tail(log)}")
            began = first["timestamp"] - first["time_total_s"]
            print(f"RLlib: training began {began - launched:.0f} s after launch; SIGINT at {minutes:g} min",
                  flush=True)
            while proc.poll() is None and time.time() < began + 60 * minutes:
                time.sleep(1)
            stopped = time.time()
            if proc.poll() is not None:
                raise SystemExit(f"RLlib exited with status {proc.returncode} before its time was up; the end "
                                 f"of {log}:\n{tail(log)}")
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                print(f"RLlib still running {STOP_S} s after SIGINT: killing its processes", flush=True)
        finally:
            usage = end_tree(proc, monitor)
            exited = time.time()
    exported = subprocess.run([str(python), str(EXPORTER), "--storage", str(storage), "--out", str(out / "policy")],
                              cwd=out, env=env, capture_output=True, text=True)
    if exported.returncode != 0:
        raise SystemExit(f"exporting RLlib's policy failed:\n{exported.stdout[-3000:]}\n{exported.stderr[-3000:]}")
    meta = json.loads(exported.stdout.strip().splitlines()[-1])
    keep_only(Path(meta["checkpoint"]))
    meta.update(launched=launched, training_began=began, sigint=stopped, exited=exited,
                cpu_s=usage.cpu_s, peak_pss_mib=usage.peak_pss_mib, status=proc.returncode)
    return meta


def keep_only(checkpoint: Path) -> None:
    """Delete the trial's checkpoints other than `checkpoint` (the one judged)."""
    for older in checkpoint.parent.glob("checkpoint_*"):
        if older.is_dir() and older.name != checkpoint.name:
            shutil.rmtree(older)


def tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def train_ours(minutes: float, out: Path) -> Path:
    """`run.py train` on configs/connect_four_league.yaml for `minutes` (wandb off, no end-of-run
    evaluation), its run folder under `out`; that folder."""
    name = "bench_strength_vs_rllib"
    cmd = [sys.executable, "run.py", "train", "--config", str(CONFIG), "--set", f"run.max_minutes={minutes}",
           "--set", f"run.name={name}", "--set", f"run.dir={out}", "--set", "run.wandb_mode=disabled",
           "--set", "evaluation.judge_games=0", "--set", "evaluation.positions=0",
           "--eval-games", "0", "--eval-history", "0"]
    out.mkdir(parents=True, exist_ok=True)
    log = out / "run.log"
    print(f"ours: {' '.join(cmd[1:])}  (log {log})", flush=True)
    with log.open("w") as stream:
        status = subprocess.run(cmd, cwd=REPO, stdout=stream, stderr=subprocess.STDOUT).returncode
    if status != 0:
        raise SystemExit(f"run.py train exited with status {status}; the end of {log}:\n{tail(log)}")
    return out / name


def ours_facts(run_dir: Path) -> dict:
    """Our run's final checkpoint and what it trained (its latest.json), and its network's parameters."""
    from impala_league.agents.policy import load_policy

    checkpoint = run_dir / "checkpoints" / "latest.safetensors"
    if not checkpoint.is_file():
        raise SystemExit(f"--ours {run_dir}: no checkpoints/latest.safetensors")
    meta = json.loads(checkpoint.with_suffix(".json").read_text())
    policy = load_policy(checkpoint)
    if policy.spec.name != "connect_four":
        raise SystemExit(f"--ours {run_dir}: a run of {policy.spec.name}, not connect_four")
    return {"run_dir": str(run_dir), "checkpoint": str(checkpoint), "minutes": meta["elapsed_s"] / 60,
            "agent_steps": meta["agent_steps_trained"], "env_steps": meta.get("counters", {}).get("env_steps"),
            "updates": meta["step"], "params": sum(p.numel() for p in policy.model.parameters() if p.requires_grad)}


def judge(side: str, where: str, what: str, count: int, seed: int) -> dict:
    """One judgement, in a worker process: `side` "ours" (`where` a checkpoint) or "rllib" (`where` the
    export's folder); `what` "positions" (count positions of seed `seed`) or a judge spec (count games a
    seat from seed `seed`, seats pooled)."""
    import torch

    from impala_league.agents.policy import load_policy
    from impala_league.evaluation.evaluate import evaluate
    from impala_league.evaluation.foreign import evaluate_player
    from impala_league.evaluation.positions import evaluate_positions
    from rllib_policy import MLPPlayer

    torch.set_num_threads(1)
    started = time.time()
    player = load_policy(where, seed=seed) if side == "ours" else MLPPlayer.load(Path(where))
    if what == "positions":
        r = evaluate_positions(player, "connect_four", count, seed=seed)
        out = {"optimal": r["all"]["optimal"], "blunder": r["all"]["blunder"], "positions": r["all"]["positions"],
               "lost": r["lost"], "phases": {name: p["blunder"] for name, p in r["phases"].items()}}
    else:
        r = (evaluate(player, what, count, seed=seed) if side == "ours"
             else evaluate_player(player, "connect_four", what, count, seed=seed))
        seats = list(r["seats"].values())
        out = {"score": float(np.mean([s["score"] for s in seats])), "seats": [s["score"] for s in seats],
               "games_per_seat": count}
    return {**out, "seconds": time.time() - started}


def judge_all(sides: dict[str, str], positions: int, positions_seed: int, judges: list[str], games: int,
              judges_seed: int, jobs: int) -> dict[str, dict[str, dict]]:
    """side -> judgement name -> judge()'s result, `jobs` judgements at once (one process each)."""
    wanted = ([("positions", positions, positions_seed)] if positions else []) + \
        [(j, games, judges_seed) for j in judges]
    tasks = [(side, where, what, count, seed) for side, where in sides.items() for what, count, seed in wanted]
    print(f"judging: {len(tasks)} judgements, {jobs} at once", flush=True)
    results: dict[str, dict[str, dict]] = {side: {} for side in sides}
    with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
        futures = [(task, pool.submit(judge, *task)) for task in tasks]
        for (side, _, what, _, _), future in futures:
            results[side][what] = future.result()
            value = results[side][what].get("blunder", results[side][what].get("score"))
            print(f"  {side} {what}: {value:.3f} ({results[side][what]['seconds']:.0f} s)", flush=True)
    return results


def cell(value, fmt: str) -> str:
    """`value` formatted with `fmt`, or "-" when missing."""
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value)


def table(ours: dict, rllib: dict, judged: dict, positions: int, judges: list[str], games: int) -> str:
    """The markdown table, ours beside RLlib's."""
    progress = rllib["progress"]
    rllib_minutes = progress["time_total_s"] / 60 if progress.get("time_total_s") is not None else None
    rows = [("training minutes", ours["minutes"], rllib_minutes, "{:.1f}"),
            ("agent steps (the learning side's moves)", ours["agent_steps"], progress.get("main_steps_sampled"),
             "{:,.0f}"),
            ("env steps (moves of both seats)", ours["env_steps"], progress.get("env_steps_sampled"), "{:,.0f}"),
            ("network parameters (trainable)", ours["params"], rllib["params"], "{:,.0f}")]
    if positions:
        for rate in ("optimal", "blunder"):
            rows.append((f"solver's positions: {rate} (of {positions})", judged["ours"]["positions"][rate],
                         judged["rllib"]["positions"][rate], "{:.1%}"))
    for j in judges:
        rows.append((f"score vs {j} ({games} games a seat, seats pooled)", judged["ours"][j]["score"],
                     judged["rllib"][j]["score"], "{:.2f}"))
    lines = [f"| | impala_league (configs/connect_four_league.yaml) | RLlib {rllib['ray']} PPO self-play example |",
             "|---|---:|---:|"]
    lines += [f"| {label} | {cell(a, fmt)} | {cell(b, fmt)} |" for label, a, b, fmt in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: .venv/bin/python bench/bench_strength_vs_rllib.py --ours runs/connect_four_league "
               "--json runs/vs_rllib.json\n         .venv/bin/python bench/bench_strength_vs_rllib.py --minutes 15 "
               "(trains ours too)\nhow RLlib is set up (pins, example, flags): this file's module docstring")
    parser.add_argument("--minutes", type=float, default=15.0,
                        help="training minutes of each side (default 15; with --ours, RLlib's)")
    parser.add_argument("--ours", type=Path, default=None,
                        help="judge this run directory's final checkpoint instead of training ours")
    parser.add_argument("--env-runners", type=int, default=1, help="RLlib's --num-env-runners (default 1)")
    parser.add_argument("--positions", type=int, default=1000, help="solver's positions a side (0: none)")
    parser.add_argument("--positions-seed", type=int, default=1, help="the positions' seed (default 1)")
    parser.add_argument("--judges", nargs="*", default=["mcts:400", "mcts:1600"], help="judge specs each side plays")
    parser.add_argument("--games", type=int, default=50, help="games a seat against each judge (default 50)")
    parser.add_argument("--judges-seed", type=int, default=0, help="seed of the judges' games (default 0)")
    parser.add_argument("--jobs", type=int, default=2, help="judgements at once, one process each (default 2)")
    parser.add_argument("--json", type=Path, default=None, help="also write everything to this JSON file")
    parser.add_argument("--out", type=Path, default=None, help="folder of the runs (default: a new temporary one)")
    args = parser.parse_args()
    if args.ours is not None and not (args.ours / "checkpoints" / "latest.safetensors").is_file():
        parser.error(f"--ours {args.ours}: no checkpoints/latest.safetensors there")
    out = (args.out or Path(tempfile.mkdtemp(prefix="bench_strength_vs_rllib-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    python = ensure_rllib_venv()
    print(f"runs in {out}; RLlib for {args.minutes:g} minutes, then "
          f"{'ours from ' + str(args.ours) if args.ours else f'ours for {args.minutes:g} minutes'}", flush=True)
    rllib = run_rllib(args.minutes, out / "rllib", python, args.env_runners)
    ours_dir = args.ours.resolve() if args.ours else train_ours(args.minutes, out / "ours")
    ours = ours_facts(ours_dir)
    judged = judge_all({"ours": ours["checkpoint"], "rllib": str(out / "rllib" / "policy")}, args.positions,
                       args.positions_seed, args.judges, args.games, args.judges_seed, args.jobs)
    print(table(ours, rllib, judged, args.positions, args.judges, args.games))
    if args.json:
        report = {"minutes": args.minutes, "cpus": os.cpu_count(), "pins": PINS,
                  "rllib_command": rllib_command(python, args.env_runners)[1:], "out": str(out),
                  "positions": args.positions, "positions_seed": args.positions_seed, "judges": args.judges,
                  "games_per_seat": args.games, "judges_seed": args.judges_seed,
                  "ours": ours, "rllib": rllib, "judged": judged}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
