"""What pixels cost the learner and the wire, measured side by side in one run.

1. The learner's update (`learn_step`: forward over T+1 steps, V-trace, backward, the optimizer's step)
   on frames [T+1, B, 4, 84, 84] uint8, in agent steps (frames of the batch) per second, for each torso;
   each case in a fresh process: float32 with glibc's default malloc, float32 after
   `distributed.launch.allocator.keep_freed_memory()` (what actors and learners run with), and the latter with
   the forward pass under a bfloat16 autocast (`learner.precision: bf16`, which `auto` picks for these
   torsos on a CPU with AMX units), and the ratios.
2. The wire: real unrolls of one actor of the config (bench_wire.actor_unrolls), bytes per unroll raw
   and as the config's compression sends them, and Redis's memory (INFO used_memory) holding
   `actor.high_water_mark` of them, the most the trajectory stream holds before actors wait.

    python bench/bench_pixels.py [--config configs/atari_pong.yaml] [--torsos shallow resnet]
                                 [--device cpu|cuda] [--reps 15] [--skip-wire] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from impala_league.agents.model import make_model  # noqa: E402
from impala_league.batch import Batch  # noqa: E402
from impala_league.config import load_config  # noqa: E402
from impala_league.distributed.learner.update import learn_step, make_optimizer  # noqa: E402
from impala_league.envs.registry import env_spec  # noqa: E402


def learner_rate(config: str, overrides: list[str], torso: str, keep: bool, device: str, reps: int) -> float:
    """Agent steps per second of `learn_step` on a random frames batch at the config's T x B (this process)."""
    if keep:
        from impala_league.distributed.launch.allocator import keep_freed_memory
        keep_freed_memory()
    torch.set_num_threads(1)
    cfg = load_config(config, [*overrides, f"agent.torso={torso}"])
    spec = env_spec(cfg.env.name, cfg.env.kwargs)
    T, B, A = cfg.actor.unroll_length, cfg.learner.batch_size, spec.num_actions
    g = torch.Generator().manual_seed(0)
    obs = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (T + 1, B, *spec.obs_shape), dtype=np.uint8))
    dev = torch.device(device)
    batch = Batch(obs=obs, action_mask=torch.ones(T + 1, B, A, dtype=torch.uint8),
                  action=torch.randint(0, A, (T, B), generator=g), reward=torch.randn(T, B, generator=g),
                  done=torch.rand(T, B, generator=g) < 0.001,
                  behaviour_logits=torch.randn(T, B, A, generator=g)).to(dev)
    model = make_model(spec, cfg.agent).to(dev)
    optimizer = make_optimizer(model, cfg.learner)
    learn_step(model, optimizer, batch, cfg.learner)  # warm-up: allocations, oneDNN's and cuDNN's plans
    times = []
    for _ in range(reps):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        learn_step(model, optimizer, batch, cfg.learner)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return T * B / statistics.median(times)


def wire(config: str) -> None:
    """Bytes per unroll and Redis's memory at the high-water mark, for real unrolls of the config's actor."""
    from bench_wire import actor_unrolls
    from impala_league.distributed.launch.launcher import EmbeddedRedis
    from impala_league.distributed.wire.codec import encode_unrolls
    from impala_league.distributed.wire.transport import connect

    cfg = load_config(config)
    unrolls, uspec = actor_unrolls(config, [], 32)
    print(f"\nthe wire: {len(unrolls)} unrolls of one actor of {cfg.env.name}, T={uspec.unroll_length}")
    sizes = {}
    for compression in ("none", cfg.transport.compression):
        payloads = [encode_unrolls([u], unroll_id=str(i), policy_version=0, actor_id=0, env=uspec.env.name,
                                   compression=compression, level=cfg.transport.compression_level)
                    for i, u in enumerate(unrolls)]
        sizes[compression] = payloads
        setting = compression if compression == "none" else f"{compression}:{cfg.transport.compression_level}"
        mean = statistics.mean(map(len, payloads))
        print(f"  {setting:8s} {mean / 1024:9,.1f} KiB per unroll  {mean / uspec.unroll_length / 1024:7,.2f} KiB "
              f"per agent step  ({mean / statistics.mean(map(len, sizes['none'])):.3f} of raw)")
    mark = cfg.actor.high_water_mark
    with EmbeddedRedis() as server:
        client = connect(server.url)
        before = client.info("memory")["used_memory"]
        payloads = sizes[cfg.transport.compression]
        for i in range(mark):
            client.xadd("bench:traj", {b"data": payloads[i % len(payloads)]})
        used = client.info("memory")["used_memory"] - before
    print(f"  Redis holding actor.high_water_mark={mark} unrolls: {used / 2**20:,.1f} MiB "
          f"({used / mark / 1024:,.1f} KiB per unroll)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "configs/atari_pong.yaml"))
    parser.add_argument("--torsos", nargs="+", default=["shallow", "resnet"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--reps", type=int, default=15, help="timed updates per case (the median is reported)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--skip-wire", action="store_true", help="only the learner's update")
    parser.add_argument("--case", nargs=2, metavar=("TORSO", "KEEP"), help=argparse.SUPPRESS)  # one child's case
    args = parser.parse_args()
    if args.case:
        torso, keep = args.case
        print(json.dumps(learner_rate(args.config, args.overrides, torso, keep == "1", args.device, args.reps)))
        return
    cfg = load_config(args.config, args.overrides)
    print(f"learner update on {cfg.env.name} frames, T x B = {cfg.actor.unroll_length} x {cfg.learner.batch_size}, "
          f"{args.device}, one thread, agent steps/s (median of {args.reps}):")
    print(f"  {'torso':8s} {'default malloc':>15s} {'keep_freed_memory':>18s} {'ratio':>6s} {'+ bf16':>8s} "
          f"{'bf16/fp32':>9s}")
    for torso in args.torsos:
        rates = [float(subprocess.run([sys.executable, __file__, "--config", args.config, "--device", args.device,
                                       "--reps", str(args.reps), "--case", torso, keep,
                                       *(f"--set={o}" for o in args.overrides), f"--set=learner.precision={precision}"],
                                      check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
                 for keep, precision in (("0", "fp32"), ("1", "fp32"), ("1", "bf16"))]
        print(f"  {torso:8s} {rates[0]:15,.0f} {rates[1]:18,.0f} {rates[1] / rates[0]:6.2f} {rates[2]:8,.0f} "
              f"{rates[2] / rates[1]:9.2f}")
    if not args.skip_wire:
        wire(args.config)


if __name__ == "__main__":
    main()
