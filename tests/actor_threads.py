"""Many real `Actor`s in one process, one thread and one Redis connection each, for load tests: 32 actor
processes would each import torch and build their envs, which takes longer than the test on 2 cores.

    python -m tests.actor_threads --first-id 0 --count 16 --config C.yaml [--set k=v ...]

Reads the Redis URL from IMPALA_REDIS_URL. Runs until SIGTERM, then prints one JSON line:
{"sent": [unrolls per actor], "errors": ["actor N: error", ...], "alive_at_stop": n}.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading

import torch

from impala_league.config import load_config
from impala_league.distributed.actor import Actor


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--first-id", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(args.config, args.overrides)
    url = os.environ["IMPALA_REDIS_URL"]
    actors = [Actor(cfg, url, actor_id) for actor_id in range(args.first_id, args.first_id + args.count)]
    errors: list[str] = []

    def run(actor: Actor) -> None:
        try:
            actor.run()
        except Exception as e:  # reported in the summary: the test fails on any
            errors.append(f"actor {actor.actor_id}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=run, args=(actor,), daemon=True) for actor in actors]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    for thread in threads:
        thread.start()
    print("started", flush=True)
    stop.wait()
    alive = sum(thread.is_alive() for thread in threads)
    for actor in actors:
        actor.stop()
    for thread in threads:
        thread.join(30)
    for actor in actors:
        actor.close()
    print(json.dumps({"sent": [actor.counters.sent for actor in actors], "errors": errors, "alive_at_stop": alive}), flush=True)


if __name__ == "__main__":
    main()
