"""Time distributed.vtrace.from_importance_weights against a plain Python loop.

The baseline is the straightforward float64 numpy loop over t (backwards) and b,
one scalar at a time: the code one writes first from Remark 1 of IMPALA
(arXiv 1802.01561). Both run side by side in one process on the same inputs,
single-threaded, and must agree before a time is printed.

    python bench/bench_vtrace.py [--reps 7] [--shapes 80x64 20x256]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from impala_league.distributed.vtrace import from_importance_weights  # noqa: E402


def loop_vtrace(log_rhos, discounts, rewards, values, bootstrap_value, rho_bar=1.0, pg_rho_bar=1.0, c_bar=1.0):
    """Per-element reference: float64, Python loop over t and b."""
    T, B = values.shape
    vs = np.zeros((T, B))
    pg = np.zeros((T, B))
    for b in range(B):
        acc = 0.0  # v_{t+1} - V(x_{t+1}); zero past the bootstrap
        for t in range(T - 1, -1, -1):
            rho = math.exp(log_rhos[t, b])
            v_next = values[t + 1, b] if t + 1 < T else bootstrap_value[b]
            delta = min(rho_bar, rho) * (rewards[t, b] + discounts[t, b] * v_next - values[t, b])
            acc = delta + discounts[t, b] * min(c_bar, rho) * acc
            vs[t, b] = values[t, b] + acc
        for t in range(T):
            rho = math.exp(log_rhos[t, b])
            vs_next = vs[t + 1, b] if t + 1 < T else bootstrap_value[b]
            pg[t, b] = min(pg_rho_bar, rho) * (rewards[t, b] + discounts[t, b] * vs_next - values[t, b])
    return vs, pg


def make_inputs(T, B, seed=0):
    rng = np.random.default_rng(seed)
    log_rhos = rng.normal(0.0, 1.0, size=(T, B))
    discounts = 0.99 * (rng.random((T, B)) > 0.05)  # some episodes end mid-unroll
    rewards = rng.normal(size=(T, B))
    values = rng.normal(size=(T, B))
    bootstrap_value = rng.normal(size=(B,))
    return [a.astype(np.float32) for a in (log_rhos, discounts, rewards, values, bootstrap_value)]


def median_seconds(fn, reps):
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_one(T, B, reps):
    inputs32 = make_inputs(T, B)
    inputs64 = [a.astype(np.float64) for a in inputs32]  # same values, widened
    tensors = [torch.from_numpy(a) for a in inputs32]  # what the learner passes: float32

    ours = from_importance_weights(*tensors)
    want_vs, want_pg = loop_vtrace(*inputs64)
    err = max(
        np.abs(ours.vs.numpy() - want_vs).max(),
        np.abs(ours.pg_advantages.numpy() - want_pg).max(),
    )
    scale = max(1.0, np.abs(want_vs).max())
    if err > 1e-4 * scale:
        raise SystemExit(f"T={T} B={B}: from_importance_weights disagrees with the loop (max abs err {err:.3g})")

    from_importance_weights(*tensors)  # warm-up
    t_ours = median_seconds(lambda: from_importance_weights(*tensors), reps)
    t_loop = median_seconds(lambda: loop_vtrace(*inputs64), reps)
    return t_loop, t_ours, err


def parse_shape(text):
    try:
        T, B = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must look like 80x64 (T x B), got {text!r}") from None
    if T < 1 or B < 1:
        raise argparse.ArgumentTypeError(f"T and B must be >= 1, got {text!r}")
    return T, B


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=7, help="repetitions per measurement; the median is reported")
    parser.add_argument(
        "--shapes",
        type=parse_shape,
        nargs="+",
        default=[(80, 64), (20, 256)],
        help="unroll shapes as TxB (default: 80x64 20x256)",
    )
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be >= 1")

    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, median of {args.reps}; ours: float32 torch, loop: float64 numpy")
    print(f"{'T':>4} {'B':>5} | {'loop ms':>9} {'ours ms':>9} {'loop/ours':>10} | {'max abs err':>11}")
    for T, B in args.shapes:
        t_loop, t_ours, err = bench_one(T, B, args.reps)
        print(f"{T:>4} {B:>5} | {t_loop * 1e3:>9.2f} {t_ours * 1e3:>9.3f} {t_loop / t_ours:>9.0f}x | {err:>11.2e}")


if __name__ == "__main__":
    main()
