"""What the recurrent core (agent.core=lstm) costs, as ratios measured side by side in one process.

1. The learner's update (forward, V-trace, backward, optimizer step; `learn_step`) with the core against
   without it, at equal T x B, for connect four's conv torso and for an MLP (CartPole-sized);
2. the core's unroll over T steps two ways on the same batch: `LSTMCore.unroll` (one nn.LSTM call per
   run of steps without a reset, cuDNN's fused kernel on a GPU) against a step-by-step loop (one call
   per step, the state masked at every step);
3. the actor's forward pass per step (one batched step of N streams) with the core against without it.

Episodes end inside the unrolls at the rate `--done` (connect four's games end about every 20 moves).

    python bench/bench_core.py [--device cpu|cuda] [--reps 20] [--T 20] [--B 32]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from impala_league.agents.core import NO_ACTION, zero_core_input  # noqa: E402
from impala_league.agents.model import make_model  # noqa: E402
from impala_league.batch import Batch  # noqa: E402
from impala_league.config import AgentConfig, LearnerConfig  # noqa: E402
from impala_league.distributed.learner.update import learn_step, make_optimizer  # noqa: E402
from impala_league.envs.registry import env_spec  # noqa: E402

CASES = {  # name: (env, agent config without the core, core_size: IMPALA's 256, and the memory configs' 64)
    "connect four, conv torso": ("connect_four", AgentConfig(torso="conv"), 256),
    "CartPole, mlp torso": ("gym:CartPole-v1", AgentConfig(torso="mlp", hidden=64), 64),
}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def median_seconds(fn, reps: int, device: torch.device) -> float:
    fn()  # warm-up (allocations, cuDNN's plans)
    times = []
    for _ in range(reps):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def random_batch(spec, T: int, B: int, core_size: int, done_rate: float, device: torch.device) -> Batch:
    g = torch.Generator().manual_seed(0)
    A = spec.num_actions
    obs = torch.from_numpy(np.random.default_rng(0).integers(0, 2, (T + 1, B, *spec.obs_shape)).astype(spec.obs_dtype))
    batch = Batch(obs=obs, action_mask=torch.ones(T + 1, B, A, dtype=torch.uint8),
                  action=torch.randint(0, A, (T, B), generator=g), reward=torch.randn(T, B, generator=g),
                  done=torch.rand(T, B, generator=g) < done_rate, behaviour_logits=torch.randn(T, B, A, generator=g))
    if core_size:
        batch.core_state = torch.randn(B, 2, core_size, generator=g)
        batch.last_action = torch.full((B,), NO_ACTION)
        batch.last_reward = torch.zeros(B)
    return batch.to(device)


def step_loop(core, x: torch.Tensor, state: torch.Tensor, reset: torch.Tensor) -> torch.Tensor:
    """The alternative to LSTMCore.unroll: one LSTM call per step, the state masked before each."""
    outputs = []
    for t in range(x.shape[0]):
        state = state * (~reset[t]).to(state.dtype)[:, None, None]
        out, state = core.step(x[t], state)
        outputs.append(out)
    return torch.stack(outputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--T", type=int, default=20)
    parser.add_argument("--B", type=int, default=32)
    parser.add_argument("--core-size", type=int, default=None, help="default: each case's own")
    parser.add_argument("--done", type=float, default=0.05, help="share of steps that end an episode")
    parser.add_argument("--actor-streams", type=int, default=32, help="N: streams one actor steps at once")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(1)  # the learner's CPU share on a 2-core machine; a GPU run ignores it
    print(f"device {device}, T={args.T} B={args.B}, {args.done:.0%} of steps end an episode; medians of {args.reps} runs")
    for name, (env, agent, size) in CASES.items():
        spec = env_spec(env)
        size = args.core_size or size
        cfg = LearnerConfig()
        times = {}
        for core in ("none", "lstm"):
            torch.manual_seed(0)
            model = make_model(spec, dataclasses.replace(agent, core=core, core_size=size)).to(device)
            optimizer = make_optimizer(model, cfg)
            batch = random_batch(spec, args.T, args.B, size if core == "lstm" else 0, args.done, device)
            times[core] = median_seconds(lambda: learn_step(model, optimizer, batch, cfg), args.reps, device)
            if core == "lstm":
                lstm_model, lstm_batch = model, batch
            obs = batch.obs[0, :1].expand(args.actor_streams, *spec.obs_shape).contiguous()
            masks = batch.action_mask[0, :1].expand(args.actor_streams, -1).contiguous()
            inputs = zero_core_input(args.actor_streams, size) if core == "lstm" else None
            if inputs is not None:
                inputs = type(inputs)(*(t.to(device) for t in inputs))
            with torch.no_grad():
                times[f"act {core}"] = median_seconds(lambda: model.step(obs, masks, inputs), args.reps, device)
        print(f"{name}, core_size {size}: update {times['none'] * 1e3:.1f} ms without the core, {times['lstm'] * 1e3:.1f} ms with it: "
              f"x{times['lstm'] / times['none']:.2f}; actor step of {args.actor_streams} streams "
              f"{times['act none'] * 1e3:.2f} -> {times['act lstm'] * 1e3:.2f} ms: "
              f"x{times['act lstm'] / times['act none']:.2f}")
        core, batch = lstm_model.core, lstm_batch
        features = torch.randn(args.T + 1, args.B, core.lstm.input_size, device=device)
        reset = torch.cat([torch.zeros_like(batch.done[:1]), batch.done])
        with torch.no_grad():
            torch.testing.assert_close(core.unroll(features, batch.core_state, reset)[0],
                                       step_loop(core, features, batch.core_state, reset), rtol=1e-4, atol=1e-5)
        runs = 1 + int(reset[1:].any(1).sum())
        for grad in (False, True):
            def timed(fn):
                def go():
                    with torch.set_grad_enabled(grad):
                        out = fn(core, features, batch.core_state, reset)
                        out = out[0] if isinstance(out, tuple) else out
                        if grad:
                            out.sum().backward()
                return median_seconds(go, args.reps, device)
            blocks, loop = timed(type(core).unroll), timed(step_loop)
            print(f"  core unroll {'forward+backward' if grad else 'forward'}: {runs} nn.LSTM calls "
                  f"{blocks * 1e3:.2f} ms, step loop ({args.T + 1} calls) {loop * 1e3:.2f} ms: loop / calls = "
                  f"{loop / blocks:.2f}")


if __name__ == "__main__":
    main()
