"""End-to-end throughput: learner-consumed SPS of a real run vs the raw rate of stepping the same envs.

Reference: one process steps `actor.num_envs` envs with one batched forward pass per step and
sampled actions, exactly the actor's inner loop without Redis, unrolls or a learner. Ours: a full
`run.py train` (embedded Redis, learner, `actor.num_actors` actors) for `--seconds`, measured as the
env steps the learner trained on per second after a warm-up. Both run in this one invocation,
one after the other, on the same machine and config. From the same run: what the actors would produce
unthrottled (their rate while not waiting for room in the stream), and the shares of the learner's
time spent in updates and waiting for batches.

    python bench/bench_sps.py [--config configs/connect_four.yaml] [--seconds 60] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from impala_league.agents.heads import sample_actions  # noqa: E402
from impala_league.agents.core import zero_core_input  # noqa: E402
from impala_league.agents.model import make_model  # noqa: E402
from impala_league.checked_config import load_config  # noqa: E402
from impala_league.envs.registry import env_spec, make_envs  # noqa: E402


def raw_sps(cfg, seconds: float) -> float:
    """Env steps per second of one process: batched inference over num_envs envs, no transport."""
    torch.set_num_threads(1)
    spec = env_spec(cfg.env.name, cfg.env.kwargs, cfg.env.seats)
    model = make_model(spec, cfg.agent).eval()
    # The actor's envs: for atari:<Game> with env.kwargs.emulator=ale_vector one vector env of all the games.
    envs = make_envs(cfg.env.name, list(range(cfg.actor.num_envs)), cfg.env.kwargs, seats=cfg.env.seats)
    steps_now = [env.advance() for env in envs]
    steps, start = 0, time.perf_counter()  # steps: agent-steps (one per acting agent)
    while time.perf_counter() - start < seconds:
        obs = torch.from_numpy(np.stack([o for s in steps_now for o in s.observations]))
        masks = torch.from_numpy(np.stack([m for s in steps_now for m in s.action_masks]))
        # A recurrent core is stepped from zeros: the same work per step as a carried state.
        core = zero_core_input(len(obs), model.core.core_size) if model.core.recurrent else None
        with torch.no_grad():
            logits, _, _ = model.step(obs, masks, core)
        actions = sample_actions(logits).tolist()
        k = 0
        for i, env in enumerate(envs):  # every env acts, then every env advances (the actor's order)
            n = len(steps_now[i].agents)
            env.act(actions[k:k + n])
            k += n
            steps += n
        steps_now = [env.advance() for env in envs]
    return steps / (time.perf_counter() - start)


def end_to_end_sps(config: str, overrides: list[str], seconds: float, warmup: float) -> tuple[float, dict]:
    """Learner-consumed env steps per second of a real training run, after `warmup` seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, str(REPO / "run.py"), "train", "--config", config, "--eval-games", "0",
               "--set", f"run.dir={tmp}", "--set", "run.name=bench", "--set", "run.wandb_mode=disabled",
               "--set", "run.log_every_s=2", "--set", "run.total_agent_steps=1000000000",
               "--set", f"run.max_minutes={(seconds + warmup) / 60}", *[a for o in overrides for a in ("--set", o)]]
        subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        records = [json.loads(line) for line in (Path(tmp) / "bench" / "metrics.jsonl").read_text().splitlines()]
    t0 = records[0]["time"] - 2
    steady = [r for r in records if r["time"] - t0 >= warmup]
    first, last = steady[0], steady[-1]
    seconds = last["time"] - first["time"]
    sps = (last["agent_steps_trained"] - first["agent_steps_trained"]) / seconds
    # What the actors would produce unthrottled: their rate while not waiting for room in the stream.
    cfg = load_config(config, overrides)
    produced = (last["unrolls_produced"] - first["unrolls_produced"]) * cfg.actor.unroll_length / seconds
    throttled = (last["actors_throttled_s"] - first["actors_throttled_s"]) / (cfg.actor.num_actors * seconds)
    steady = steady[1:]  # each record's shares cover the seconds since the one before
    return sps, {"policy_lag": float(np.mean([r["policy_lag"] for r in steady])),
                 "queue_depth": float(np.mean([r["queue_depth"] for r in steady])),
                 "high_water_mark": cfg.actor.high_water_mark, "produced": produced, "throttled": throttled,
                 "unthrottled": produced / max(1.0 - throttled, 1e-9),
                 "update_share": float(np.mean([r["update_share"] for r in steady])),
                 "wait_share": float(np.mean([r["wait_share"] for r in steady]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "configs/connect_four.yaml"))
    parser.add_argument("--seconds", type=float, default=60.0, help="measured seconds of the end-to-end run")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds of the end-to-end run not measured")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    cfg = load_config(args.config, args.overrides)
    raw = raw_sps(cfg, min(args.seconds, 20.0))
    e2e, extra = end_to_end_sps(args.config, args.overrides, args.seconds, args.warmup)
    cores = os.cpu_count()
    print(f"env {cfg.env.name}, torso {cfg.agent.torso} (learner on {cfg.learner.device}), {cfg.actor.num_actors} actors x {cfg.actor.num_envs} envs, "
          f"T={cfg.actor.unroll_length}, B={cfg.learner.batch_size}, {cores} cores")
    print(f"  raw env + batched inference, 1 process : {raw:10,.0f} steps/s")
    print(f"  end-to-end, learner-consumed           : {e2e:10,.0f} steps/s  "
          f"(policy lag {extra['policy_lag']:.1f} updates, queue {extra['queue_depth']:.0f} unrolls)")
    print(f"  ratio end-to-end / raw                 : {e2e / raw:10.2f}")
    print(f"  actors: produced {extra['produced']:,.0f} steps/s, throttled {extra['throttled']:.0%} of their time; "
          f"unthrottled {extra['unthrottled']:,.0f} steps/s")
    print(f"  ratio learner-consumed / unthrottled   : {e2e / extra['unthrottled']:10.2f}  "
          f"(queue {extra['queue_depth']:.0f} of high-water mark {extra['high_water_mark']})")
    print(f"  learner's update thread: {extra['update_share']:.0%} in updates, {extra['wait_share']:.0%} waiting "
          "for batches")


if __name__ == "__main__":
    main()
