"""The learner's ingest path against the raw rate of reading the same entries from the same Redis.

Real connect-four unrolls (sent by a real actor, see bench_wire.py) are encoded once and replayed
into an embedded Redis: `--entries` stream entries, each with a unique unroll id. Then, side by side:

- raw: XREADGROUP of B entries at a time in one loop, then XACK, nothing else;
- ingest: the learner's own path without the optimizer step: `Learner.ingest` (read, duplicate
  check, decode, validate, stack) in the ingest thread, `learner.prefetch_batches` ahead, and
  `Learner.acknowledge` (ack, count as trained) in the update's thread, as `Learner.run` does.

Both are measured in unrolls per second over the same number of entries; the ratio is ingest / raw.

    python bench/bench_ingest.py [--entries 4000] [--set transport.compression=zstd] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import torch  # noqa: E402

from bench_wire import actor_unrolls  # noqa: E402
from config import load_config  # noqa: E402
from distributed.codec import encode_unroll  # noqa: E402
from distributed.ingest import Prefetcher  # noqa: E402
from distributed.launcher import EmbeddedRedis  # noqa: E402
from distributed.learner import Learner  # noqa: E402
from distributed.transport import GROUP, TrajectoryStream, connect  # noqa: E402


def fill(client, key: str, unrolls: list[dict], env: str, entries: int, compression: str, level: int) -> None:
    """`entries` stream entries cycling through `unrolls`, each with its own unroll id."""
    pipe = client.pipeline(transaction=False)
    for i in range(entries):
        pipe.xadd(key, {"data": encode_unroll(unrolls[i % len(unrolls)], unroll_id=f"bench-{i}", policy_version=0,
                                              actor_id=0, env=env, compression=compression, level=level)})
        if i % 500 == 499:
            pipe.execute()
    pipe.execute()


def raw_rate(client, key: str, batch: int, entries: int) -> float:
    """Unrolls per second of XREADGROUP + XACK alone."""
    client.xgroup_create(key, "raw", id="0")
    read, start = 0, time.perf_counter()
    while read < entries:
        got = client.xreadgroup("raw", "c", {key: ">"}, count=batch)
        ids = [entry_id for entry_id, _ in got[0][1]]
        client.xack(key, "raw", *ids)
        read += len(ids)
    return read / (time.perf_counter() - start)


def ingest_rate(learner: Learner, entries: int) -> float:
    """Unrolls per second of the learner's ingest path and ack, without the update: as in
    `Learner.run`, the ingest thread prepares `learner.prefetch_batches` batches ahead (0: in this
    thread) and this thread acks each batch it takes."""
    learner.trajectories.ensure_group()
    depth = learner.cfg.learner.prefetch_batches
    batches = Prefetcher(learner.ingest, depth) if depth else None
    done, start = 0, time.perf_counter()
    while done < entries:
        ids, headers, _ = batches.get() if batches else learner.ingest()
        learner.acknowledge(ids, headers)
        done += len(ids)
    elapsed = time.perf_counter() - start
    learner.reading = False
    if batches:
        batches.close()
    return done / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/connect_four.yaml")
    parser.add_argument("--entries", type=int, default=4000)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    torch.set_num_threads(1)
    unrolls, uspec = actor_unrolls(args.config, [], 64)
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis() as server:
        cfg = load_config(REPO / args.config, [*args.overrides, "run.name=ingest", f"run.dir={tmp}",
                                               "run.wandb_mode=disabled"])
        B = cfg.learner.batch_size
        args.entries = -(-args.entries // B) * B  # whole batches: the learner waits for a full last one
        (Path(tmp) / "ingest").mkdir()
        client = connect(server.url)
        key = TrajectoryStream(client, "ingest").key
        fill(client, key, unrolls, uspec.env.name, args.entries, cfg.transport.compression,
             cfg.transport.compression_level)
        raw = raw_rate(client, key, cfg.learner.batch_size, args.entries)
        learner = Learner(cfg, server.url, Path(tmp) / "ingest")
        ours = ingest_rate(learner, args.entries)
        assert client.xpending(key, GROUP)["pending"] == 0
    print(f"{uspec.env.name}, T={uspec.unroll_length}, B={cfg.learner.batch_size}, {args.entries} entries, "
          f"compression {cfg.transport.compression}")
    print(f"  raw XREADGROUP + XACK             : {raw:10,.0f} unrolls/s")
    print(f"  learner ingest (read..stack) + ack: {ours:10,.0f} unrolls/s  ({ours * uspec.unroll_length:,.0f} steps/s)")
    print(f"  ratio ingest / raw                : {ours / raw:10.2f}")


if __name__ == "__main__":
    main()
