"""A fleet of light simulated actors against the learner's ingest path, for transport.shards = 1, 2, 4.

Real connect-four unrolls (sent by a real actor, see bench_wire.py) are encoded once. `--workers`
processes then drive `--actors` simulated actors between them (default 256), each with its own Redis
connection and its own shard (actor_id % shards), as a real actor: it sends one entry of `actor.send_batch`
unrolls per add at `--rate` unrolls per second, with its `produced` count in the same script
(`TrajectoryStream.add`), and follows the real backpressure rule (no add while its shard's backlog, as
last counted, is above `actor.high_water_mark`; recounted every 50 ms, as `wait_for_room` polls). Each
send re-packs a pre-encoded entry with a fresh id, as an actor's entries have.

The learner runs its own ingest path without the optimizer step, as bench_ingest.py: `Ingest.next_batch`
(read every shard, decode, validate, stack) in the ingest thread and
`Learner.acknowledge` (ack to each entry's shard, count as trained) here. After `--seconds` the actors
stop, then the learner; the table gives the learner-consumed SPS (env steps per second of acked
unrolls), the peak `used_memory` of Redis (all servers), the final backlog, and whether
produced == trained + dead-lettered + backlog holds (nothing lost).

Weights ride along as they do in a real run. A simulated learner publishes the connect-four network's
real weights (`ParamStore.publish`, safetensors blob with its SHA-256) at `--publish-hz` per second,
by default the rate at which this machine's learner makes real updates (`learner.publish_every` of
them per publish), measured first on the same unrolls. Every simulated actor syncs as `Actor.send` does:
after an add that crosses a multiple of `actor.param_sync_every` unrolls it reads the weights' name
(`ParamStore.name`) and, when it changed, fetches the blob (`ParamStore.fetch_bytes`, SHA-256 checked).

`--replicas 0 1 2` repeats each point with that many read-only replicas of the run's Redis
(`redis-server --replicaof`, transport.params_urls; actor i reads replica i % R). The weights table
gives, per second: unroll bytes the actors added and weight bytes they fetched, from the run's Redis
and from replicas (counted in the client: lengths of the payloads added and of the blobs returned),
and what the run's Redis sent in all (INFO stats `total_net_output_bytes`, which in Redis 6 includes
the replication stream) and to its replicas (INFO replication `master_repl_offset` delta x replicas:
every write once per replica, unrolls included). `copies/blob`: blob bytes that left the run's Redis,
fetched from it by actors plus what it sent its replicas less the unrolls added to it (which they copy
too), over the blob bytes published. `resyncs` counts full resynchronisations during the point (INFO
stats `sync_full`): a replica that fell further behind than the replication backlog.

    python bench/bench_fleet.py [--actors 256] [--shards 1 2 4] [--seconds 10] [--rate 4] [--workers 2]
                                [--servers 1] [--replicas 0] [--publish-hz HZ] [--set key=value ...]

`--servers k` puts the shards on k embedded Redis servers (transport.shard_urls) instead of one.
The weights table of docs/architecture.md ("Weights to many actors"):

    python bench/bench_fleet.py --actors 64 256 512 --shards 1 --replicas 0 1 2 --seconds 20
"""

from __future__ import annotations

import argparse
import json
import logging
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
    from impala_league.distributed.wire.params import ParamStore, params_replica
    from impala_league.distributed.wire.transport import TrajectoryStream, actor_shard, connect, shard_urls

    pool = [msgpack.unpackb(p, raw=False) for p in msgpack.unpackb(Path(args.payloads).read_bytes())]
    ids = [int(i) for i in args.ids.split(",")]
    urls = shard_urls(args.url, args.shards, args.urls.split(",") if args.urls else [])
    clients = [connect(args.url) for _ in ids]  # one connection per actor to the run's Redis, as an actor's
    streams = [TrajectoryStream(clients[k] if urls[actor_shard(i, args.shards)] == args.url else
                                connect(urls[actor_shard(i, args.shards)]), args.run,
                                shard=actor_shard(i, args.shards)) for k, i in enumerate(ids)]
    replica_urls = args.params_urls.split(",") if args.params_urls else []
    stores = [ParamStore(clients[k], args.run, args.delay, *params_replica(args.url, replica_urls, i))
              for k, i in enumerate(ids)]
    logging.getLogger("params").setLevel(logging.ERROR)  # a fallback per simulated actor: the table counts them
    held = [(-1, None)] * len(ids)  # per actor: the name (version, SHA-256) of the weights it holds
    weights = {"primary": 0, "replica": 0, "fetches": 0, "replica_fetches": 0}
    unroll_bytes = unroll_bytes_run = 0  # all, and those added to the run's Redis (the rest: shard servers)
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
            payload = msgpack.packb(msg, use_bin_type=True)
            unroll_bytes += len(payload)
            unroll_bytes_run += len(payload) if stream.r is clients[k] else 0
            backlog[k] = stream.add([payload], producer=f"{ids[k]}-{token}", produced=sent[k])
            counted_at[k] = now
            next_at[k] = max(next_at[k] + period, now - period)  # a late actor catches up by one send, no more
            if (sent[k] - args.send_batch) // args.sync_every != sent[k] // args.sync_every:  # as Actor.send
                held[k] = sync_weights(stores[k], held[k], weights)
        time.sleep(max(0.0, min(min(next_at) - time.monotonic(), 0.005)))
    print(json.dumps({"sent": sum(sent), "held_back": held_back, "unroll_bytes": unroll_bytes,
                      "unroll_bytes_run": unroll_bytes_run,
                      "fallbacks": sum(store.replica_fallbacks for store in stores), **weights}))


def sync_weights(store, held: tuple[int, bytes | None], weights: dict[str, int]) -> tuple[int, bytes | None]:
    """`Actor.sync_params` without the network: fetch the blob when the weights' name changed; count its
    bytes by where it came from. Returns the name of the weights now held."""
    if store.name() == held:
        return held
    raw = store.fetch_bytes()
    if raw is None:
        return held
    weights["fetches"] += 1
    weights["replica_fetches"] += store.from_replica
    weights["replica" if store.from_replica else "primary"] += len(raw[1])
    return raw[0], store.fetched_digest


# -- one configuration ------------------------------------------------------------------------------------
def _fleet_config(args: argparse.Namespace, run: str, shards: int, urls: list[str], params_urls: list[str],
                  tmp: str):
    """The run's config for one point of the table: `shards` trajectory shards on `urls` (none: the run's
    Redis), weights replicas at `params_urls`, no time or frame limit."""
    from impala_league.config import load_config

    overrides = [*args.overrides, f"run.name={run}", f"run.dir={tmp}", "run.wandb_mode=disabled",
                 f"transport.shards={shards}", "run.total_agent_steps=1000000000000"]
    if urls:
        overrides.append(f"transport.shard_urls=[{','.join(urls)}]")
    if params_urls:
        overrides.append(f"transport.params_urls=[{','.join(params_urls)}]")
    return load_config(REPO / args.config, overrides)


def _start_worker(args: argparse.Namespace, cfg, w: int, actors: int, url: str, urls: list[str],
                  params_urls: list[str], payload_file: str, stop_file: Path) -> subprocess.Popen:
    """Worker process `w` of args.workers, playing the simulated actors w, w + workers, ... of `actors`."""
    ids = ",".join(str(i) for i in range(w, actors, args.workers))
    return subprocess.Popen(
        [sys.executable, __file__, "--worker", "--url", url, "--urls", ",".join(urls),
         "--params-urls", ",".join(params_urls),
         "--run", cfg.run.name, "--shards", str(cfg.transport.shards), "--ids", ids, "--rate", str(args.rate),
         "--hwm", str(-(-cfg.actor.high_water_mark // cfg.actor.send_batch)),  # in entries, as actors wait
         "--send-batch", str(cfg.actor.send_batch), "--sync-every", str(cfg.actor.param_sync_every),
         "--delay", str(cfg.actor.weight_delay),
         "--payloads", payload_file, "--stop-file", str(stop_file)],
        stdout=subprocess.PIPE, text=True)


def _sent_by(url: str) -> tuple[int, int, int]:
    """What the Redis at `url` has sent: (output bytes, replication offset, full syncs)."""
    import redis

    info = redis.Redis.from_url(url).info()
    return info["total_net_output_bytes"], info["master_repl_offset"], info["sync_full"]


def _row(cfg, point: tuple[int, int, int, int], consumed: int, elapsed: float, window: float, peak: int,
         counts: dict, reports: list[dict], published: int, blob: int, before: tuple, after: tuple) -> dict:
    """One row of the table: `point` = (actors, shards, servers, replicas); `consumed` unrolls trained in
    `elapsed` s; the workers' `reports` over their `window` s; `peak` bytes of Redis memory; the primary's
    (output bytes, replication offset, full syncs) `before` and `after`."""
    actors, shards, servers, replicas = point
    out_before, repl_before, full_before = before
    out_after, repl_after, full_after = after
    sent = sum(r["sent"] for r in reports)
    total = {k: sum(r[k] for r in reports) for k in ("unroll_bytes", "unroll_bytes_run", "primary", "replica",
                                                     "fetches", "replica_fetches", "fallbacks")}
    # The backlog counts entries: send_batch unrolls each.
    balanced = counts["produced"] == counts["trained"] + counts["dead_lettered"] + \
        counts["backlog"] * cfg.actor.send_batch and counts["produced"] == sent
    return {"actors": actors, "shards": shards, "servers": servers, "replicas": replicas,
            "sps": consumed * cfg.actor.unroll_length / elapsed, "unrolls_per_s": consumed / elapsed,
            "peak_mb": peak / 2**20, "backlog": counts["backlog"], "counts": counts, "sent": sent,
            "balanced": balanced, "window_s": window, "published": published, "blob": blob,
            "unroll_bps": total["unroll_bytes"] / window, "unroll_run_bps": total["unroll_bytes_run"] / window,
            "weights_primary_bps": total["primary"] / window,
            "weights_replica_bps": total["replica"] / window, "fetches": total["fetches"],
            "replica_fetches": total["replica_fetches"], "fallbacks": total["fallbacks"],
            "primary_out_bps": (out_after - out_before) / window,
            "primary_repl_bps": (repl_after - repl_before) * replicas / window,
            "full_syncs": full_after - full_before}


def run_fleet(args: argparse.Namespace, actors: int, shards: int, replicas: int, publish_hz: float,
              weights: dict, payload_file: str, tmp: str) -> dict:
    """Actors, learner, and a publisher of `weights` (a state_dict) at `publish_hz`, for one point of
    the table (actors, shards, replicas); returns its row."""
    import redis

    from impala_league.distributed.launch.launcher import EmbeddedRedis
    from impala_league.distributed.learner.ingest_thread import Prefetcher
    from impala_league.distributed.learner.role import Learner
    from impala_league.distributed.wire.codec import encode_weights
    from impala_league.distributed.wire.params import ParamStore
    from impala_league.distributed.wire.transport import connect

    servers = [EmbeddedRedis()]
    servers += [EmbeddedRedis(password=servers[0].password) for _ in range(min(args.servers, shards) - 1)]
    copies = [EmbeddedRedis(appendonly=False, replica_of=servers[0]) for _ in range(replicas)]
    urls = [f"redis://127.0.0.1:{s.port}/0" for s in servers] if len(servers) > 1 else []
    params_urls = [f"redis://127.0.0.1:{s.port}/0" for s in copies]
    run = f"fleet{actors}-{shards}-{replicas}"
    cfg = _fleet_config(args, run, shards, urls, params_urls, tmp)
    (Path(tmp) / run).mkdir(exist_ok=True)
    stop_file = Path(tmp) / f"stop-{run}"
    peak = [0]
    sampling = threading.Event()
    publishing = threading.Event()
    published = [0]

    def sample_memory() -> None:
        clients = [redis.Redis.from_url(s.url) for s in servers]
        while not sampling.wait(0.1):
            peak[0] = max(peak[0], sum(c.info("memory")["used_memory"] for c in clients))

    def publish() -> None:  # the learner's publish, at the rate of its updates
        store = ParamStore(connect(servers[0].url), run, delay=cfg.actor.weight_delay)
        start = time.monotonic()
        while not publishing.is_set():
            published[0] += 1
            store.publish(weights, published[0])
            publishing.wait(max(0.0, start + published[0] / publish_hz - time.monotonic()))

    publisher = threading.Thread(target=publish, daemon=True)
    try:
        learner = Learner(cfg, servers[0].url, Path(tmp) / run)
        learner.ingest.trajectories.ensure_group()
        publisher.start()
        out_before, repl_before, full_before = _sent_by(servers[0].url)
        began = time.monotonic()
        procs = [_start_worker(args, cfg, w, actors, servers[0].url, urls, params_urls, payload_file, stop_file)
                 for w in range(args.workers)]
        sampler = threading.Thread(target=sample_memory, daemon=True)
        sampler.start()
        depth = cfg.learner.prefetch_batches
        batches = Prefetcher(learner.ingest.next_batch, depth) if depth else None
        consumed, start = 0, time.monotonic()
        while time.monotonic() - start < args.seconds:
            ids, headers, _ = batches.get() if batches else learner.ingest.next_batch()
            learner.acknowledge(ids, headers)
            consumed += sum(h["unrolls"] for h in headers)
        elapsed = time.monotonic() - start
        stop_file.touch()
        reports = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
        window = time.monotonic() - began  # the workers' whole life, as their counts
        out_after, repl_after, full_after = _sent_by(servers[0].url)
        publishing.set()
        publisher.join()
        learner.ingest.reading = False  # what the ingest thread prefetched stays pending: the backlog counts it
        if batches:
            batches.close()
        sampling.set()
        sampler.join()
        counts = learner.ingest.trajectories.accounting()
    finally:
        stop_file.touch()
        publishing.set()
        for s in copies + servers:
            s.stop()
    return _row(cfg, (actors, shards, len(servers), replicas), consumed, elapsed, window, peak[0], counts, reports,
                published[0], len(encode_weights(weights)), (out_before, repl_before, full_before),
                (out_after, repl_after, full_after))


def measure_publish_hz(cfg_path: str, overrides: list[str], payloads: list[bytes], tmp: str,
                       seconds: float = 4.0) -> tuple[float, dict]:
    """Publishes per second of a real learner on this machine (updates per second / learner.publish_every:
    ingest, V-trace update and publish of `train_on`, on the replayed unrolls) and its last weights."""
    from impala_league.config import load_config
    from impala_league.distributed.launch.launcher import EmbeddedRedis
    from impala_league.distributed.learner.role import Learner
    from impala_league.distributed.wire.transport import TrajectoryStream, connect

    cfg = load_config(REPO / cfg_path, [*overrides, "run.name=rate", f"run.dir={tmp}", "run.wandb_mode=disabled",
                                        "run.total_agent_steps=1000000000000"])
    (Path(tmp) / "rate").mkdir(exist_ok=True)
    with EmbeddedRedis(appendonly=False) as server:
        learner = Learner(cfg, server.url, Path(tmp) / "rate")
        learner.ingest.trajectories.ensure_group()
        stream = TrajectoryStream(connect(server.url), "rate")
        batches = 40
        for i in range(cfg.learner.batch_size * batches // cfg.actor.send_batch):
            msg = msgpack.unpackb(payloads[i % len(payloads)], raw=False)
            msg["header"]["unroll_id"] = f"rate-{i}"
            stream.add([msgpack.packb(msg, use_bin_type=True)], producer="rate", produced=(i + 1) * cfg.actor.send_batch)
        updates, start = -1, 0.0
        while updates < 0 or (time.monotonic() - start < seconds and updates < batches - 2):
            ids, headers, batch = learner.ingest.next_batch()
            learner.train_on(batch)
            learner.acknowledge(ids, headers)
            updates += 1
            if updates == 0:  # the first update warms up
                start = time.monotonic()
        rate = updates / (time.monotonic() - start) / cfg.learner.publish_every
        return rate, {k: v.detach().clone() for k, v in learner.model.state_dict().items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/connect_four.yaml")
    parser.add_argument("--actors", type=int, nargs="+", default=[256],
                        help="simulated actors (one Redis connection each), one point per count")
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--replicas", type=int, nargs="+", default=[0],
                        help="read-only replicas of the run's Redis that actors fetch weights from")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per point")
    parser.add_argument("--rate", type=float, default=4.0, help="unrolls per second each simulated actor offers")
    parser.add_argument("--publish-hz", type=float, default=None,
                        help="weight publishes per second (default: this machine's real learner update rate)")
    parser.add_argument("--workers", type=int, default=2, help="processes driving the simulated actors")
    parser.add_argument("--servers", type=int, default=1, help="Redis servers the shards are spread over")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    # worker mode (started by main)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for name in ("--url", "--urls", "--params-urls", "--run", "--ids", "--payloads", "--stop-file"):
        parser.add_argument(name, default="", help=argparse.SUPPRESS)
    parser.add_argument("--hwm", type=int, default=256, help=argparse.SUPPRESS)
    parser.add_argument("--send-batch", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--sync-every", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--delay", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.shards = args.shards[0]
        return worker(args)

    import torch

    from bench_wire import actor_unrolls
    from impala_league.config import load_config
    from impala_league.distributed.wire.codec import encode_unrolls

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
        measured_hz, weights = measure_publish_hz(args.config, args.overrides, payloads, tmp)
        publish_hz = args.publish_hz or measured_hz
        print(f"  learner: {measured_hz:.2f} publishes/s measured (real updates, learner.publish_every="
              f"{cfg.learner.publish_every}); publishing at {publish_hz:.2f}/s", flush=True)
        payload_file = str(Path(tmp) / "payloads.msgpack")
        Path(payload_file).write_bytes(msgpack.packb(payloads, use_bin_type=True))
        for actors in args.actors:
            for shards in args.shards:
                for replicas in args.replicas:
                    rows.append(run_fleet(args, actors, shards, replicas, publish_hz, weights, payload_file, tmp))
                    r = rows[-1]
                    print(f"  actors={actors} shards={shards} replicas={replicas}: {r['sps']:,.0f} SPS, "
                          f"counts {r['counts']}, sent {r['sent']}, {r['fetches']} weight fetches "
                          f"({r['replica_fetches']} from replicas, {r['fallbacks']} fallbacks)", flush=True)
    print(f"\n{uspec.env.name}, T={uspec.unroll_length}, B={cfg.learner.batch_size}, "
          f"{sum(map(len, payloads)) // (len(payloads) * K):,} B per unroll, {args.rate:g} unrolls/s offered per actor, "
          f"actor.high_water_mark={cfg.actor.high_water_mark} per shard, send_batch={cfg.actor.send_batch}, "
          f"{args.seconds:g} s each, {args.workers} actor processes, {os.cpu_count()} cores")
    print(f"{'actors':>7} {'shards':>6} {'servers':>7} {'replicas':>8} {'learner SPS':>12} {'unrolls/s':>10} "
          f"{'peak MB':>8} {'backlog':>8}  produced = trained + dead + backlog (entries x send_batch)")
    for r in rows:
        c = r["counts"]
        print(f"{r['actors']:>7} {r['shards']:>6} {r['servers']:>7} {r['replicas']:>8} {r['sps']:>12,.0f} "
              f"{r['unrolls_per_s']:>10,.0f} {r['peak_mb']:>8.1f} {r['backlog']:>8}  {c['produced']} = {c['trained']} + "
              f"{c['dead_lettered']} + {c['backlog']} x {K}  {'ok' if r['balanced'] else 'MISMATCH'}")
    print_weights_table(rows, publish_hz, cfg.actor.param_sync_every)


def print_weights_table(rows: list[dict], publish_hz: float, sync_every: int) -> None:
    """Weights against unrolls, per point: MB/s counted in the client and what the run's Redis sent."""
    mb = 1e6
    print(f"\nweights: {rows[0]['blob']:,} B per blob, {publish_hz:.2f} publishes/s, actors check every "
          f"{sync_every} unrolls sent; MB/s over each point's whole window (client counts; Redis INFO)")
    print(f"{'actors':>7} {'replicas':>8} {'unrolls in':>10} {'w. from run':>11} {'w./unrolls':>10} "
          f"{'w. from repl':>12} {'fallbacks':>9} {'run out':>8} {'to replicas':>11} {'blobs/s':>8} "
          f"{'copies/blob':>11} {'resyncs':>7}")
    for r in rows:
        blobs_bps = r["published"] * r["blob"] / r["window_s"]
        # Copies of each published blob that left the run's Redis: those actors fetched from it (counted),
        # and what it sent its replicas (INFO) less the unrolls added to it, which each replica copies too.
        copies = (r["weights_primary_bps"] + r["primary_repl_bps"] - r["replicas"] * r["unroll_run_bps"]) / blobs_bps
        print(f"{r['actors']:>7} {r['replicas']:>8} {r['unroll_bps'] / mb:>10.2f} {r['weights_primary_bps'] / mb:>11.2f} "
              f"{r['weights_primary_bps'] / r['unroll_bps']:>10.1f} {r['weights_replica_bps'] / mb:>12.2f} "
              f"{r['fallbacks']:>9} {r['primary_out_bps'] / mb:>8.2f} {r['primary_repl_bps'] / mb:>11.2f} "
              f"{r['published'] / r['window_s']:>8.2f} {copies:>11.1f} {r['full_syncs']:>7}")


if __name__ == "__main__":
    main()
