"""The Pong config (configs/atari_pong.yaml) against Sample Factory 2.1.1's APPO, side by side on this machine.

Both train Atari Pong from pixels for the same minutes, one after the other (Sample Factory first), with the
same network (IMPALA's shallow torso: conv 16 8x8 stride 4, conv 32 4x4 stride 2, FC 256, ReLU, policy and
value heads; both parameter counts are printed), 2 workers of 16 games each (ours: actor.num_actors=2,
actor.num_envs=16), unrolls of 20, batches of 80 agent steps (ours: learner.batch_size=4 unrolls of 20),
Adam at 0.0006, V-trace, both learners on the CPU, and the same preprocessing: ALE/Pong-v5 with the
evaluation protocol's sticky actions (`--sticky-actions`, default 0.25, Machado et al.'s and ALE v5's own,
on which Sample Factory's own Atari numbers are trained; 0 for the older protocol without them), the
minimal 6 actions, frame skip 4, 84 x 84 grayscale, a stack of 4, up to 30 no-op starts.

    .venv/bin/python bench/bench_vs_sample_factory.py [--minutes 8] [--json PATH] [--out DIR]

Example, the default 8 minutes each on an otherwise idle machine (16 minutes of training plus both start-ups):

    .venv/bin/python bench/bench_vs_sample_factory.py --json runs/bench_vs_sample_factory.json

It prints one table, Sample Factory / ours / ours-to-Sample-Factory ratio:

* emulator frames per second trained, over the second half of each run's training (start-up excluded);
* agent steps per second trained from launch to the end of training (start-up included);
* seconds from launch to the first training record (within a second: both sides record every second);
* peak PSS of the whole process tree (the root and all its descendants, sampled every second), MiB;
* CPU cores used: the tree's CPU time over its wall time, launch to exit;
* the mean return of the training episodes that ended in each wall-clock minute since launch.

Ours is `run.py train --config configs/atari_pong.yaml` with run.max_minutes, run.dir and run.name set,
wandb off, a metrics record every second (run.log_every_s=1) and no evaluation (--eval-games 0
--eval-history 0); its metrics.jsonl gives agent_steps_trained (emulator frames trained are 4 per agent
step), the episodes and their mean return. Sample Factory runs bench/sample_factory_appo.py, whose module doc
lists its settings, the two fixes it applies to Sample Factory 2.1.1 at load time (V-trace summaries,
upstream PRs #278/#332; --train_for_seconds, PR #330) and the progress file it writes from Sample Factory's
own counters.

Sample Factory needs its own virtual environment: on first use this script creates
bench/.venv-sample-factory (git-ignored) and pip-installs `PINS` into it from the configured package
index: sample-factory 2.1.1, numpy < 2, gymnasium 0.29, ale-py 0.9 (its wheel carries the ROMs) and this
venv's torch version, so both sides run the same torch. A marker file records the pins; change them and
the next run reinstalls.

Each run should have the machine to itself: run nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from impala_league.evaluation.atari_protocol import DEFAULT, PROTOCOLS  # noqa: E402

CONFIG = REPO / "configs" / "atari_pong.yaml"
SF_VENV = REPO / "bench" / ".venv-sample-factory"
SF_LAUNCHER = REPO / "bench" / "sample_factory_appo.py"
PINS = ["sample-factory==2.1.1", "numpy<2", "gymnasium==0.29.*", "ale-py==0.9.*", f"torch=={version('torch')}"]
FRAME_SKIP = 4  # emulator frames per agent step on both sides
GRACE_S = 300  # past minutes + this, a side that has not ended is stopped (SIGINT, then SIGKILL)


def ensure_sf_venv(venv: Path = SF_VENV) -> Path:
    """The python of Sample Factory's virtual environment `venv`, created and filled with `PINS` first when
    missing or installed with other pins (its `.bench-pins` marker says which)."""
    python, marker = venv / "bin" / "python", venv / ".bench-pins"
    if python.exists() and marker.exists() and marker.read_text().split("\n") == PINS:
        return python
    print(f"creating {venv} with {' '.join(PINS)}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *PINS], check=True)
    marker.write_text("\n".join(PINS))
    return python


@dataclass
class TreeUsage:
    """What a process tree used: `peak_pss_mib`, the largest sum of PSS over the root and its descendants
    at one sample; `cpu_s`, user + system CPU seconds of the whole tree; `samples`: how many were taken."""

    peak_pss_mib: float = 0.0
    cpu_s: float = 0.0
    samples: int = 0


class TreeMonitor:
    """Samples the process tree of `pid` every `every_s` seconds on a thread, until `stop()`, which returns
    its `TreeUsage`. CPU time: the last seen of each process, summed (a process that ends between two
    samples loses its last second); `run_tree` takes the larger of that and the reaped children's rusage."""

    def __init__(self, pid: int, every_s: float = 1.0):
        self.root = psutil.Process(pid)
        self.every_s = every_s
        self.usage = TreeUsage()
        self.cpu: dict[tuple[int, float], float] = {}  # (pid, create_time) -> CPU seconds last seen
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def tree(self) -> list[psutil.Process]:
        """The root and its descendants now (none once the root is gone)."""
        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def sample(self) -> None:
        """One sample: the tree's PSS sum and each process's CPU seconds."""
        pss = 0
        for proc in self.tree():
            try:
                with proc.oneshot():
                    pss += proc.memory_full_info().pss
                    times = proc.cpu_times()
                    self.cpu[(proc.pid, proc.create_time())] = times.user + times.system
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        self.usage.peak_pss_mib = max(self.usage.peak_pss_mib, pss / 2**20)
        self.usage.samples += 1

    def loop(self) -> None:
        while not self.stopping.is_set():
            self.sample()
            self.stopping.wait(self.every_s)

    def stop(self) -> TreeUsage:
        """Stop sampling; the usage seen."""
        self.stopping.set()
        self.thread.join()
        self.usage.cpu_s = sum(self.cpu.values())
        return self.usage


@dataclass
class Launch:
    """One process tree's run: `launched` and `exited` (s since the epoch), its exit `status`, its `usage`."""

    launched: float
    exited: float
    status: int
    usage: TreeUsage


def stop_tree(proc: subprocess.Popen, monitor: TreeMonitor) -> None:
    """A side that overran: SIGINT to its root (both stop their children in order on it), then, after 60 s,
    SIGKILL to each process of the tree still alive (all of them started by this script)."""
    print(f"pid {proc.pid} still running past its time: SIGINT", flush=True)
    descendants = monitor.tree()
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        for p in descendants + monitor.tree():
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        proc.wait()


def run_tree(cmd: list[str], log: Path, timeout_s: float, env: dict | None = None) -> Launch:
    """Run `cmd` from the repository root with its output to `log`, sampling its process tree (TreeMonitor);
    stopped by `stop_tree` past `timeout_s`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with log.open("w") as out:
        launched = time.time()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)
        monitor = TreeMonitor(proc.pid)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_tree(proc, monitor)
        exited = time.time()
        usage = monitor.stop()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    usage.cpu_s = max(usage.cpu_s, reaped)
    return Launch(launched, exited, proc.returncode, usage)


@dataclass
class Side:
    """One side's run: its `launch`, `params` (trainable), `progress` [(time, emulator frames trained)] and
    `episodes` [(time, count, mean return)] at each record, times in s since the epoch."""

    name: str
    launch: Launch
    params: int
    progress: list[tuple[float, int]] = field(default_factory=list)
    episodes: list[tuple[float, int, float]] = field(default_factory=list)


def check_exit(name: str, launch: Launch, log: Path) -> None:
    """Raise SystemExit with the tail of `log` when a side failed."""
    if launch.status != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise SystemExit(f"{name} exited with status {launch.status}; the end of {log}:\n{tail}")


def run_ours(minutes: float, out: Path, sticky: float) -> Side:
    """`run.py train` on configs/atari_pong.yaml for `minutes` with sticky actions `sticky`, its run folder
    under `out`; its metrics.jsonl."""
    from impala_league.agents.model import make_model
    from impala_league.config import load_config
    from impala_league.envs.registry import env_spec

    cfg = load_config(CONFIG)
    spec = env_spec(cfg.env.name, cfg.env.kwargs)
    assert spec.frames_per_step == FRAME_SKIP, spec.frames_per_step
    params = sum(p.numel() for p in make_model(spec, cfg.agent).parameters() if p.requires_grad)
    name = "bench_vs_sample_factory"
    cmd = [sys.executable, "run.py", "train", "--config", str(CONFIG), "--set", f"run.max_minutes={minutes}",
           "--set", f"run.name={name}", "--set", f"run.dir={out}", "--set", "run.wandb_mode=disabled",
           "--set", "run.log_every_s=1", "--set", f"env.kwargs.sticky_actions={sticky}",
           "--eval-games", "0", "--eval-history", "0"]
    log = out / "run.log"
    out.mkdir(parents=True, exist_ok=True)
    launch = run_tree(cmd, log, 60 * minutes + GRACE_S)
    check_exit("run.py train", launch, log)
    side = Side("ours", launch, params)
    for line in (out / name / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        side.progress.append((record["time"], FRAME_SKIP * record["agent_steps_trained"]))
        if record.get("episodes"):
            side.episodes.append((record["time"], record["episodes"], record["episode_return"]))
    return side


def run_sample_factory(minutes: float, out: Path, python: Path, sticky: float) -> Side:
    """bench/sample_factory_appo.py for `minutes` with sticky actions `sticky` in Sample Factory's venv
    (`python`), its folder `out`."""
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # nothing of this venv in Sample Factory's
    counted = subprocess.run([str(python), str(SF_LAUNCHER), "--count-params"], cwd=REPO, env=env, check=True,
                             capture_output=True, text=True)
    params = json.loads(counted.stdout.strip().splitlines()[-1])["params"]
    progress = out / "progress.jsonl"
    cmd = [str(python), str(SF_LAUNCHER), "--train-dir", str(out), "--experiment", "pong_appo",
           "--seconds", str(round(60 * minutes)), "--progress", str(progress), "--sticky-actions", str(sticky)]
    log = out / "run.log"
    launch = run_tree(cmd, log, 60 * minutes + GRACE_S, env)
    check_exit("Sample Factory", launch, log)
    side = Side("sample_factory", launch, params)
    for line in progress.read_text().splitlines():
        record = json.loads(line)
        side.progress.append((record["time"], record["frames_trained"]))
        if record["returns"]:
            returns = record["returns"]
            side.episodes.append((record["time"], len(returns), sum(returns) / len(returns)))
    return side


def frames_at(progress: list[tuple[float, int]], t: float) -> float:
    """Frames trained at time `t`, linear between the records around it."""
    for (t0, f0), (t1, f1) in zip(progress, progress[1:]):
        if t0 <= t <= t1:
            return f0 + (f1 - f0) * (t - t0) / max(t1 - t0, 1e-9)
    return float(progress[-1][1] if t >= progress[-1][0] else progress[0][1])


def summarize(side: Side, minutes: int) -> dict:
    """The table's numbers of one side: `fps_second_half` (emulator frames trained per second over the
    second half of training, first training record to last), `agent_sps_launch_to_end` (agent steps trained
    per second, launch to the last record), `first_training_s` (launch to the first record with frames
    trained), `peak_pss_mib`, `cores` (tree CPU seconds / wall seconds launch to exit), `returns_by_minute`
    (mean return of the episodes that ended in each minute 1..`minutes` after launch; None without any)
    and `episodes_by_minute` (how many)."""
    launched = side.launch.launched
    trained = [(t, f) for t, f in side.progress if f > 0]
    if not trained:
        raise SystemExit(f"{side.name}: no frames trained in {side.launch.exited - launched:.0f} s")
    first, (last, frames) = trained[0][0], side.progress[-1]
    middle = (first + last) / 2
    by_minute, counts = [], []
    for minute in range(1, minutes + 1):
        ended = [(n, r) for t, n, r in side.episodes if 60 * (minute - 1) < t - launched <= 60 * minute]
        counts.append(sum(n for n, _ in ended))
        by_minute.append(sum(n * r for n, r in ended) / counts[-1] if counts[-1] else None)
    wall = side.launch.exited - launched
    return {"params": side.params,
            "fps_second_half": (frames - frames_at(side.progress, middle)) / max(last - middle, 1e-9),
            "agent_sps_launch_to_end": frames / FRAME_SKIP / max(last - launched, 1e-9),
            "first_training_s": first - launched, "peak_pss_mib": side.launch.usage.peak_pss_mib,
            "cores": side.launch.usage.cpu_s / max(wall, 1e-9), "returns_by_minute": by_minute,
            "episodes_by_minute": counts,
            "emulator_frames_trained": frames, "training_s": last - first, "wall_s": wall,
            "cpu_s": side.launch.usage.cpu_s, "episodes": sum(n for _, n, _ in side.episodes),
            "launch": asdict(side.launch)}


ROWS = [("network parameters (trainable)", "params", "{:,.0f}"),
        ("emulator frames/s trained, second half", "fps_second_half", "{:,.0f}"),
        ("agent steps/s trained, launch to end", "agent_sps_launch_to_end", "{:,.0f}"),
        ("seconds from launch to first training", "first_training_s", "{:.1f}"),
        ("peak PSS of the process tree, MiB", "peak_pss_mib", "{:,.0f}"),
        ("CPU cores used (tree CPU time / wall)", "cores", "{:.2f}")]


def ratio(ours: float | None, theirs: float | None) -> float | None:
    """ours / theirs, None where either is missing or theirs is 0."""
    if ours is None or theirs is None or theirs == 0:
        return None
    return ours / theirs


def cell(value: float | None, fmt: str) -> str:
    """`value` formatted with `fmt`, or "-" when missing."""
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value)


def mean_return(summary: dict, minute: int) -> str:
    """The table's cell of the mean return in `minute` (0-based) since launch, with its episode count."""
    count = summary["episodes_by_minute"][minute]
    return "-" if not count else f"{summary['returns_by_minute'][minute]:.1f} ({count} ep.)"


def table(sf: dict, ours: dict) -> str:
    """The markdown table of both summaries: Sample Factory, ours, and their ratio ours / Sample Factory."""
    lines = ["| | Sample Factory 2.1.1 APPO | impala_league | ours / SF |", "|---|---:|---:|---:|"]
    for label, key, fmt in ROWS:
        lines.append(f"| {label} | {cell(sf[key], fmt)} | {cell(ours[key], fmt)} | "
                     f"{cell(ratio(ours[key], sf[key]), '{:.2f}')} |")
    for minute in range(len(sf["returns_by_minute"])):
        lines.append(f"| mean return, minute {minute + 1} since launch | {mean_return(sf, minute)} | "
                     f"{mean_return(ours, minute)} | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="example: .venv/bin/python bench/bench_vs_sample_factory.py --minutes 8 "
                                            "--json runs/bench_vs_sample_factory.json")
    parser.add_argument("--minutes", type=float, default=8.0, help="training minutes of each side (default 8)")
    parser.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    parser.add_argument("--out", default=None, help="folder of both runs (default: a new temporary folder)")
    parser.add_argument("--sticky-actions", type=float, default=PROTOCOLS[DEFAULT]["sticky_actions"],
                        help="sticky actions of both sides' games (default 0.25, the evaluation protocol's; 0: none)")
    args = parser.parse_args()
    if not 0.0 <= args.sticky_actions < 1.0:
        parser.error("--sticky-actions must be in [0, 1)")
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_vs_sample_factory-"))
    python = ensure_sf_venv()
    print(f"runs in {out}; Sample Factory first, {args.minutes:g} minutes each, sticky actions "
          f"{args.sticky_actions:g}", flush=True)
    sf = run_sample_factory(args.minutes, out / "sample_factory", python, args.sticky_actions)
    ours = run_ours(args.minutes, out / "ours", args.sticky_actions)
    minutes = math.ceil(max(s.progress[-1][0] - s.launch.launched for s in (sf, ours)) / 60)
    summaries = {"sample_factory": summarize(sf, minutes), "ours": summarize(ours, minutes)}
    print(table(summaries["sample_factory"], summaries["ours"]))
    if args.json:
        ratios = {key: ratio(summaries["ours"][key], summaries["sample_factory"][key]) for _, key, _ in ROWS}
        report = {"minutes": args.minutes, "sticky_actions": args.sticky_actions, "cpus": os.cpu_count(),
                  "pins": PINS, "out": str(out),
                  **summaries, "ratio_ours_to_sample_factory": ratios}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
