"""A fleet of light simulated actors against the learner's ingest path, for transport.shards = 1, 2, 4.

Real connect-four unrolls (sent by a real actor, see bench_wire.py) are encoded once. `--workers`
processes then drive `--actors` simulated actors between them (default 256), each with its own Redis
connection and its own shard (actor_id % shards), as a real actor: it sends one entry of `actor.send_batch`
unrolls per add at `--rate` unrolls per second, with its `produced` count in the same script
(`TrajectoryStream.add`), and follows the real backpressure rule (no add while its shard's backlog, as
last counted, is above `actor.high_water_mark`; recounted every 50 ms, as `wait_for_room` polls). Each
send re-packs a pre-encoded entry with a fresh id, as an actor's entries have.

The learner runs its own ingest path without the optimizer step, as bench_ingest.py: `Learner.ingest`
(read every shard, decode, validate, stack) in the ingest thread and
`Learner.acknowledge` (ack to each entry's shard, count as trained) here. After `--seconds` the actors
stop, then the learner; the table gives the learner-consumed SPS (env steps per second of acked
unrolls), the peak `used_memory` of Redis (all servers), the final backlog, and whether
produced == trained + dead-lettered + backlog holds (nothing lost).

    python bench/bench_fleet.py [--actors 256] [--shards 1 2 4] [--seconds 10] [--rate 4] [--workers 2]
                                [--servers 1] [--set key=value ...]

`--servers k` puts the shards on k embedded Redis servers (transport.shard_urls) instead of one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import msgpack

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

BACKLOG_POLL_S = 0.05  # as TrajectoryStream.wait_for_room


# -- simulated actors (a worker process: imports no torch) ----------------------------------------------
def worker(args: argparse.Namespace) -> None:
    """Drive simulated actors `args.ids` until `args.stop_file` exists; print what they sent as JSON."""
    from distributed.transport import TrajectoryStream, actor_shard, connect, shard_urls

    pool = [msgpack.unpackb(p, raw=False) for p in msgpack.unpackb(Path(args.payloads).read_bytes())]
    ids = [int(i) for i in args.ids.split(",")]
    urls = shard_urls(args.url, args.shards, args.urls.split(",") if args.urls else [])
    streams = [TrajectoryStream(connect(urls[actor_shard(i, args.shards)]), args.run,
                                shard=actor_shard(i, args.shards)) for i in ids]  # one connection per actor
    token = uuid.uuid4().hex[:8]
    period = args.send_batch / args.rate
    start = time.monotonic()
    next_at = [start + period * k / len(ids) for k in range(len(ids))]  # spread the first sends
    backlog = [0] * len(ids)
    counted_at = [0.0] * len(ids)
    sent = [0] * len(ids)
    held_back = 0
    while not os.path.exists(args.stop_file):
        now = time.monotonic()
        for k, stream in enumerate(streams):
            if now < next_at[k]:
                continue
            if backlog[k] > args.hwm:  # the actor waits for room: recount at most every BACKLOG_POLL_S
                if now - counted_at[k] < BACKLOG_POLL_S:
                    continue
                backlog[k], counted_at[k] = stream.backlog(), now
                if backlog[k] > args.hwm:
                    held_back += 1
                    continue
            msg = pool[(ids[k] + sent[k]) % len(pool)]
            msg["header"]["unroll_id"] = f"{ids[k]}-{token}-{sent[k]}"
            msg["header"]["actor_id"] = ids[k]
            sent[k] += args.send_batch
            backlog[k] = stream.add([msgpack.packb(msg, use_bin_type=True)], producer=f"{ids[k]}-{token}",
                                    produced=sent[k])
            counted_at[k] = now
            next_at[k] = max(next_at[k] + period, now - period)  # a late actor catches up by one send, no more
        time.sleep(max(0.0, min(min(next_at) - time.monotonic(), 0.005)))
    print(json.dumps({"sent": sum(sent), "held_back": held_back}))


# -- one configuration ------------------------------------------------------------------------------------
def run_fleet(args: argparse.Namespace, shards: int, payload_file: str, tmp: str) -> dict:
    """Actors and learner for one shard count; returns the row of the table."""
    from config import load_config
    from distributed.ingest import Prefetcher
    from distributed.launcher import EmbeddedRedis
    from distributed.learner import Learner

    servers = [EmbeddedRedis()]
    servers += [EmbeddedRedis(password=servers[0].password) for _ in range(min(args.servers, shards) - 1)]
    urls = [f"redis://127.0.0.1:{s.port}/0" for s in servers] if len(servers) > 1 else []
    run = f"fleet{shards}"
    overrides = [*args.overrides, f"run.name={run}", f"run.dir={tmp}", "run.wandb_mode=disabled",
                 f"transport.shards={shards}", "run.total_frames=1000000000000"]
    if urls:
        overrides.append(f"transport.shard_urls=[{','.join(urls)}]")
    cfg = load_config(REPO / args.config, overrides)
    (Path(tmp) / run).mkdir(exist_ok=True)
    stop_file = Path(tmp) / f"stop-{shards}"
    peak = [0]
    sampling = threading.Event()

    def sample_memory() -> None:
        import redis
        clients = [redis.Redis.from_url(s.url) for s in servers]
        while not sampling.wait(0.1):
            peak[0] = max(peak[0], sum(c.info("memory")["used_memory"] for c in clients))

    try:
        learner = Learner(cfg, servers[0].url, Path(tmp) / run)
        learner.trajectories.ensure_group()
        procs = []
        for w in range(args.workers):
            ids = ",".join(str(i) for i in range(w, args.actors, args.workers))
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--worker", "--url", servers[0].url, "--urls", ",".join(urls),
                 "--run", run, "--shards", str(shards), "--ids", ids, "--rate", str(args.rate),
                 "--hwm", str(-(-cfg.actor.high_water_mark // cfg.actor.send_batch)),  # in entries, as actors wait
                 "--send-batch", str(cfg.actor.send_batch),
                 "--payloads", payload_file, "--stop-file", str(stop_file)],
                stdout=subprocess.PIPE, text=True))
        sampler = threading.Thread(target=sample_memory, daemon=True)
        sampler.start()
        depth = cfg.learner.prefetch_batches
        batches = Prefetcher(learner.ingest, depth) if depth else None
        consumed, start = 0, time.monotonic()
        while time.monotonic() - start < args.seconds:
            ids, headers, _ = batches.get() if batches else learner.ingest()
            learner.acknowledge(ids, headers)
            consumed += sum(h["unrolls"] for h in headers)
        elapsed = time.monotonic() - start
        stop_file.touch()
        sent = sum(json.loads(p.communicate(timeout=60)[0])["sent"] for p in procs)
        learner.reading = False  # what the ingest thread prefetched stays pending: the backlog counts it
        if batches:
            batches.close()
        sampling.set()
        sampler.join()
        counts = learner.trajectories.accounting()
    finally:
        stop_file.touch()
        for s in servers:
            s.stop()
    # The backlog counts entries: send_batch unrolls each.
    balanced = counts["produced"] == counts["trained"] + counts["dead_lettered"] + \
        counts["backlog"] * cfg.actor.send_batch and counts["produced"] == sent
    return {"actors": args.actors, "shards": shards, "servers": len(servers),
            "sps": consumed * cfg.actor.unroll_length / elapsed, "unrolls_per_s": consumed / elapsed,
            "peak_mb": peak[0] / 2**20, "backlog": counts["backlog"], "counts": counts, "sent": sent,
            "balanced": balanced}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/connect_four.yaml")
    parser.add_argument("--actors", type=int, default=256, help="simulated actors (one Redis connection each)")
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per shard count")
    parser.add_argument("--rate", type=float, default=4.0, help="unrolls per second each simulated actor offers")
    parser.add_argument("--workers", type=int, default=2, help="processes driving the simulated actors")
    parser.add_argument("--servers", type=int, default=1, help="Redis servers the shards are spread over")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    # worker mode (started by main)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for name in ("--url", "--urls", "--run", "--ids", "--payloads", "--stop-file"):
        parser.add_argument(name, default="", help=argparse.SUPPRESS)
    parser.add_argument("--hwm", type=int, default=256, help=argparse.SUPPRESS)
    parser.add_argument("--send-batch", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.shards = args.shards[0]
        return worker(args)

    import torch

    from bench_wire import actor_unrolls
    from config import load_config
    from distributed.codec import encode_unrolls

    torch.set_num_threads(1)
    unrolls, uspec = actor_unrolls(args.config, [], 32)
    cfg = load_config(REPO / args.config, args.overrides)
    K = cfg.actor.send_batch
    payloads = [encode_unrolls([unrolls[(i + j) % len(unrolls)] for j in range(K)], unroll_id=f"pool-{i}",
                               policy_version=0, actor_id=0, env=uspec.env.name,
                               compression=cfg.transport.compression, level=cfg.transport.compression_level)
                for i in range(len(unrolls))]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        payload_file = str(Path(tmp) / "payloads.msgpack")
        Path(payload_file).write_bytes(msgpack.packb(payloads, use_bin_type=True))
        for shards in args.shards:
            rows.append(run_fleet(args, shards, payload_file, tmp))
            r = rows[-1]
            print(f"  shards={shards}: {r['sps']:,.0f} SPS, counts {r['counts']}, sent {r['sent']}", flush=True)
    print(f"\n{uspec.env.name}, T={uspec.unroll_length}, B={cfg.learner.batch_size}, "
          f"{sum(map(len, payloads)) // (len(payloads) * K):,} B per unroll, {args.rate:g} unrolls/s offered per actor, "
          f"actor.high_water_mark={cfg.actor.high_water_mark} per shard, send_batch={cfg.actor.send_batch}, "
          f"{args.seconds:g} s each, {args.workers} actor processes, {os.cpu_count()} cores")
    print(f"{'actors':>7} {'shards':>6} {'servers':>7} {'learner SPS':>12} {'unrolls/s':>10} {'peak MB':>8} "
          f"{'backlog':>8}  produced = trained + dead + backlog (entries x send_batch)")
    for r in rows:
        c = r["counts"]
        print(f"{r['actors']:>7} {r['shards']:>6} {r['servers']:>7} {r['sps']:>12,.0f} {r['unrolls_per_s']:>10,.0f} "
              f"{r['peak_mb']:>8.1f} {r['backlog']:>8}  {c['produced']} = {c['trained']} + {c['dead_lettered']} + "
              f"{c['backlog']} x {K}  {'ok' if r['balanced'] else 'MISMATCH'}")


if __name__ == "__main__":
    main()
