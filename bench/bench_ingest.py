"""The learner's ingest path against the raw rate of reading the same entries from the same Redis.

Real connect-four unrolls (sent by a real actor, see bench_wire.py) are encoded once, `actor.send_batch`
to a stream entry as actors send them, and replayed into an embedded Redis: `--unrolls` unrolls, each
entry with a unique id. Then, side by side:

- raw: XREADGROUP of the entries holding B unrolls at a time in one loop, then XACK, nothing else;
- ingest: the learner's own path without the optimizer step: `Ingest.next_batch` (read, decode,
  validate, stack) in the ingest thread, `learner.prefetch_batches` ahead, and
  `Learner.acknowledge` (ack, count as trained) in the update's thread, as `Learner.run` does.

Both are measured in unrolls per second over the same entries; the ratio is ingest / raw. A shared
machine's speed drifts from second to second, so `--rounds` pairs run one right after the other (each
on a fresh stream) and the ratio is that of the totals.

Beside the rates, the CPU time each process spent per batch of B unrolls (Linux: /proc), which says
what the ratio cannot on a machine that the processes fill: the learner process's share bounds one
learner's ingest however many cores it has (with `learner.ingest_workers` the workers' share spreads
over as many processes), and Redis's share is what the run's server pays.

    python bench/bench_ingest.py [--unrolls 8000] [--rounds 3] [--set actor.send_batch=1]
                                 [--set transport.compression=zstd] [--set learner.ingest_workers=2
                                 --set learner.prefetch_batches=4] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import torch  # noqa: E402

from bench_wire import actor_unrolls  # noqa: E402
from impala_league.config import load_config  # noqa: E402
from impala_league.distributed.launch.launcher import EmbeddedRedis  # noqa: E402
from impala_league.distributed.learner.role import Learner  # noqa: E402
from impala_league.distributed.wire.codec import encode_unrolls  # noqa: E402
from impala_league.distributed.wire.transport import GROUP, TrajectoryStream, connect  # noqa: E402


def fill(client, key: str, payloads: list[bytes]) -> None:
    """The encoded entries on the stream `key`, in pipelines of 100."""
    for first in range(0, len(payloads), 100):
        pipe = client.pipeline(transaction=False)
        for data in payloads[first:first + 100]:
            pipe.xadd(key, {"data": data})
        pipe.execute()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (all its threads); 0 where /proc is missing."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds spent by processes (by pid) between `start` and `stop`, per role."""

    def __init__(self):
        self.spent: dict[str, float] = {}
        self.started: dict[str, tuple[list[int], float]] = {}

    def start(self, role: str, pids: list[int]) -> None:
        self.started[role] = (pids, sum(map(cpu_s, pids)))

    def stop(self) -> None:
        for role, (pids, before) in self.started.items():
            self.spent[role] = self.spent.get(role, 0.0) + sum(map(cpu_s, pids)) - before
        self.started = {}


def raw_rate(client, key: str, per_read: int, per_entry: int, entries: int) -> float:
    """Unrolls per second of XREADGROUP (`per_read` entries at a time) + XACK alone."""
    client.xgroup_create(key, "raw", id="0")
    read, start = 0, time.perf_counter()
    while read < entries:
        got = client.xreadgroup("raw", "c", {key: ">"}, count=per_read)
        ids = [entry_id for entry_id, _ in got[0][1]]
        client.xack(key, "raw", *ids)
        read += len(ids)
    return read * per_entry / (time.perf_counter() - start)


def ingest_rate(learner: Learner, unrolls: int, meter: CpuMeter, redis_pid: int) -> float:
    """Unrolls per second of the learner's ingest path and ack, without the update: as in
    `Learner.run`, the ingest thread (or `learner.ingest_workers` processes) prepares
    `learner.prefetch_batches` batches ahead (0: in this thread) and this thread acks each batch it
    takes. The workers' start (a process each) is not timed."""
    learner.ingest.trajectories.ensure_group()
    learner.ingest.reading = True
    batches = learner.ingest.start()
    first = batches.get() if batches else None  # started: time from the first batch on
    workers = [p.pid for p in learner.ingest.workers.procs] if learner.ingest.workers else []
    meter.start("learner", [os.getpid()])
    meter.start("workers", workers)
    meter.start("redis", [redis_pid])
    done, start = 0, time.perf_counter()
    if first:
        learner.acknowledge(first[0], first[1])
        unrolls -= sum(h["unrolls"] for h in first[1])
    while done < unrolls:
        ids, headers, _ = batches.get() if batches else learner.ingest.next_batch()
        learner.acknowledge(ids, headers)
        done += sum(h["unrolls"] for h in headers)
    elapsed = time.perf_counter() - start
    meter.stop()
    learner.ingest.close()
    return done / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/connect_four.yaml")
    parser.add_argument("--unrolls", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    torch.set_num_threads(1)
    unrolls, uspec = actor_unrolls(args.config, [], 64)
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis() as server:
        cfg = load_config(REPO / args.config, [*args.overrides, "run.name=ingest", f"run.dir={tmp}",
                                               "run.wandb_mode=disabled"])
        B, K = cfg.learner.batch_size, cfg.actor.send_batch
        total = -(-args.unrolls // B) * B  # whole batches: the learner waits for a full last one
        payloads = [encode_unrolls([unrolls[(i + j) % len(unrolls)] for j in range(K)], unroll_id=f"bench-{i}",
                                   policy_version=0, actor_id=0, env=uspec.env.name,
                                   compression=cfg.transport.compression, level=cfg.transport.compression_level)
                    for i in range(0, total, K)]
        (Path(tmp) / "ingest").mkdir()
        client = connect(server.url)
        key = TrajectoryStream(client, "ingest").key
        learner = Learner(cfg, server.url, Path(tmp) / "ingest")
        raw_s = ingest_s = 0.0
        raw_cpu, ingest_cpu = CpuMeter(), CpuMeter()
        for r in range(args.rounds):
            client.delete(key)  # a fresh stream
            fill(client, key, payloads)
            raw_cpu.start("client", [os.getpid()])
            raw_cpu.start("redis", [server.proc.pid])
            raw = raw_rate(client, key, B // K, K, len(payloads))
            raw_cpu.stop()
            ours = ingest_rate(learner, total, ingest_cpu, server.proc.pid)
            assert client.xpending(key, GROUP)["pending"] == 0
            raw_s, ingest_s = raw_s + total / raw, ingest_s + total / ours
            print(f"  round {r + 1}: raw {raw:9,.0f}  ingest {ours:9,.0f} unrolls/s  ratio {ours / raw:.2f}")
    raw, ours = total * args.rounds / raw_s, total * args.rounds / ingest_s
    print(f"{uspec.env.name}, T={uspec.unroll_length}, B={B}, {K} unrolls per entry, {total} unrolls x "
          f"{args.rounds} rounds, compression {cfg.transport.compression}")
    print(f"  raw XREADGROUP + XACK             : {raw:10,.0f} unrolls/s")
    print(f"  learner ingest (read..stack) + ack: {ours:10,.0f} unrolls/s  ({ours * uspec.unroll_length:,.0f} steps/s)")
    print(f"  ratio ingest / raw                : {ours / raw:10.2f}")
    batches = total * args.rounds / B
    for name, meter in (("raw", raw_cpu), ("ingest", ingest_cpu)):
        print(f"  CPU per batch of {B}, {name:6}     : " + ", ".join(
            f"{role} {spent / batches * 1e3:.3f} ms" for role, spent in meter.spent.items()))


if __name__ == "__main__":
    main()
