"""Learner-consumed SPS across a slow network link, with and without compressed unrolls.

Two hosts on one machine: Redis and the learner in one network namespace, the actors in another,
joined by a veth pair whose both directions are shaped with `tc` (token bucket, `--mbit` Mbit/s).
The same run is made once per `transport.compression` (none, zstd), each for `--seconds` after a
warm-up, and the learner-consumed env steps per second are printed side by side with the bytes per
step the stream carried. Needs root and iproute2 (`ip`, `tc`).

    sudo python bench/bench_bandwidth.py [--config configs/battle.yaml] [--mbit 50] [--seconds 40]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.netns import linked_namespaces, namespaces_refused  # noqa: E402
from impala_league.checked_config import load_config  # noqa: E402
from impala_league.distributed.launch.launcher import redis_server_binary  # noqa: E402
from impala_league.distributed.wire.transport import TrajectoryStream, connect  # noqa: E402


@contextmanager
def two_hosts(mbit: float):
    """(server namespace, actor namespace, server address, actor's link device): a veth link shaped
    to `mbit` each way (a token bucket on each end's egress)."""
    with linked_namespaces(secrets.token_hex(3), 232) as link:
        for ns, dev in ((link.server_ns, link.server_dev), (link.actor_ns, link.actor_dev)):
            subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{mbit}mbit",
                            "burst", "64kb", "latency", "200ms"], check=True, capture_output=True, text=True)
        yield link.server_ns, link.actor_ns, link.server_ip, link.actor_dev


def tx_bytes(ns: str, dev: str) -> int:
    """Bytes sent so far by `dev` in namespace `ns` (the actors' side of the link: unrolls, results)."""
    out = subprocess.run(["ip", "netns", "exec", ns, "cat", f"/sys/class/net/{dev}/statistics/tx_bytes"],
                         check=True, capture_output=True, text=True).stdout
    return int(out)


def measure(config: str, overrides: list[str], compression: str, mbit: float, seconds: float,
            warmup: float) -> dict:
    """One run across the shaped link: learner-consumed steps/s after `warmup`, bytes per step."""
    cfg = load_config(config, overrides)
    with tempfile.TemporaryDirectory() as tmp, two_hosts(mbit) as (server_ns, actor_ns, server_ip, link):
        tmp = Path(tmp)
        password = secrets.token_hex(16)
        sock = tmp / "redis.sock"  # this process's own way in: a unix socket crosses namespaces
        settings = [*overrides, "run.name=bw", f"run.dir={tmp}", "run.wandb_mode=disabled", "run.log_every_s=2",
                    "run.total_agent_steps=1000000000", f"transport.compression={compression}"]
        args = ["--config", config, *[a for s in settings for a in ("--set", s)]]
        env = dict(os.environ, IMPALA_REDIS_URL=f"redis://:{password}@{server_ip}:6379/0", PYTHONUNBUFFERED="1")
        procs = []

        def start(ns: str, *cmd: str) -> None:
            procs.append(subprocess.Popen(["ip", "netns", "exec", ns, *cmd], cwd=REPO, env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True))

        try:
            start(server_ns, redis_server_binary(), "--bind", server_ip, "--port", "6379", "--requirepass", password,
                  "--unixsocket", str(sock), "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
                  "--dir", str(tmp))
            while not sock.exists():
                time.sleep(0.05)
            client = connect(f"unix://:{password}@{sock}?db=0")
            (tmp / "bw").mkdir()
            start(server_ns, sys.executable, str(REPO / "run.py"), "learner", *args, "--run-dir", str(tmp / "bw"))
            for i in range(cfg.actor.num_actors):
                start(actor_ns, sys.executable, str(REPO / "run.py"), "actor", *args, "--actor-id", str(i))
            time.sleep(warmup)
            stream = TrajectoryStream(client, "bw")
            t0, before, sent0 = time.monotonic(), stream.accounting(), tx_bytes(actor_ns, link)
            time.sleep(seconds)
            elapsed, after, sent = time.monotonic() - t0, stream.accounting(), tx_bytes(actor_ns, link) - sent0
            backlog = after["backlog"]
            used = client.info("memory")["used_memory"]
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
        records = [json.loads(line) for line in (tmp / "bw" / "metrics.jsonl").read_text().splitlines()]
    T = cfg.actor.unroll_length
    produced = T * (after["produced"] - before["produced"])
    return {"sps": T * (after["trained"] - before["trained"]) / elapsed, "produced_sps": produced / elapsed,
            "link_mbit": 8 * sent / elapsed / 1e6, "bytes_per_step": sent / max(produced, 1), "backlog": backlog, "redis_mb": used / 2 ** 20,
            "policy_lag": records[-1].get("policy_lag", float("nan")) if records else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "configs/battle.yaml"))
    parser.add_argument("--mbit", type=float, default=50.0, help="link rate, each direction (Mbit/s)")
    parser.add_argument("--seconds", type=float, default=40.0, help="measured seconds of each run")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds of each run not measured")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    why = namespaces_refused() or (None if shutil.which("tc") else "no `tc` command (iproute2)")
    if why:
        sys.exit(f"bench_bandwidth needs root and iproute2 (ip, tc): {why}")
    cfg = load_config(args.config, args.overrides)
    results = {c: measure(args.config, args.overrides, c, args.mbit, args.seconds, args.warmup) for c in ("none", "zstd")}
    print(f"env {cfg.env.name}, {cfg.actor.num_actors} actors x {cfg.actor.num_envs} envs, T={cfg.actor.unroll_length}, "
          f"link {args.mbit:g} Mbit/s each way, {args.seconds:g} s measured after {args.warmup:g} s")
    for c, r in results.items():
        print(f"  compression {c:5s}: {r['sps']:9,.0f} steps/s learner-consumed, {r['produced_sps']:9,.0f} sent by the "
              f"actors; link {r['link_mbit']:.1f} Mbit/s actors->Redis ({r['bytes_per_step']:,.0f} B/step); "
              f"policy lag {r['policy_lag']:.1f}, backlog {r['backlog']} unrolls, Redis {r['redis_mb']:.0f} MiB")
    print(f"  ratio zstd / none  : {results['zstd']['sps'] / max(results['none']['sps'], 1e-9):9.2f}")


if __name__ == "__main__":
    main()
