"""Bytes on the wire per env step, raw and zstd-compressed, for unrolls that real actors produce.

For each game, a real actor (its config's network, fresh weights, sampled actions) plays into an
embedded Redis until `--unrolls` unrolls are on its trajectory stream. Those very unrolls are then
encoded with each `transport.compression` setting and `--per-entry` unrolls to a stream entry
(`actor.send_batch`: one zstd frame per array then spans them all), side by side: bytes per env step
(one step of one learning stream), the ratio to raw, one unroll per entry, and the encoder's and
decoder's cost per unroll (the decoder validating as the learner does).

    python bench/bench_wire.py [--unrolls 64] [--levels 1 3 9] [--per-entry 1 8]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from impala_league.agents.model import make_model  # noqa: E402
from impala_league.config import load_config  # noqa: E402
from impala_league.distributed.actor import Actor  # noqa: E402
from impala_league.distributed.launch.launcher import EmbeddedRedis  # noqa: E402
from impala_league.distributed.wire.codec import UnrollSpec, decode_unroll, decode_unrolls, encode_unrolls  # noqa: E402
from impala_league.distributed.wire.params import ParamStore  # noqa: E402
from impala_league.distributed.wire.transport import connect  # noqa: E402
from impala_league.envs.registry import env_spec  # noqa: E402

GAMES = {
    "connect_four": ("configs/connect_four.yaml", []),
    "battle": ("configs/battle.yaml", []),
    "sc2:MoveToBeacon (mock)": ("configs/sc2_move_to_beacon.yaml", ["env.kwargs.mock=true"]),
}


def actor_unrolls(config: str, overrides: list[str], count: int) -> tuple[list[dict], UnrollSpec]:
    """`count` decoded unrolls that one real actor of `config` sent to Redis."""
    with EmbeddedRedis() as server:
        cfg = load_config(REPO / config, [*overrides, "run.name=wire", "actor.num_envs=4",
                                          f"actor.high_water_mark={count}", "actor.send_batch=1",
                                          f"learner.batch_size={min(count, 16)}"])
        client = connect(server.url)
        spec = env_spec(cfg.env.name, cfg.env.kwargs)
        ParamStore(client, "wire").publish(make_model(spec, cfg.agent).state_dict(), 0)
        actor = Actor(cfg, server.url, 0)
        thread = threading.Thread(target=actor.run, daemon=True)
        thread.start()
        while client.xlen("wire:traj") < count:
            time.sleep(0.1)
        actor.stop()
        thread.join(60)
        actor.close()  # its id lease, whose keeper thread would otherwise outlive this Redis
        uspec = UnrollSpec(spec, cfg.actor.unroll_length)
        entries = client.xrange("wire:traj", count=count)
        # As the actor sent them: the decoder adds empty final observations where no step was truncated.
        return [{name: a for name, a in decode_unroll(fields[b"data"], uspec)[1].items()
                 if name in uspec.arrays or len(a)} for _, fields in entries], uspec


def measure(unrolls: list[dict], uspec: UnrollSpec, compression: str, level: int, per_entry: int
            ) -> tuple[float, float, float]:
    """(bytes per env step, encode µs per unroll, decode µs per unroll), `per_entry` unrolls to an entry."""
    start = time.perf_counter()
    payloads = [encode_unrolls(unrolls[i:i + per_entry], unroll_id=str(i), policy_version=0, actor_id=0,
                               env=uspec.env.name, compression=compression, level=level)
                for i in range(0, len(unrolls), per_entry)]
    encoded = time.perf_counter()
    assert not any(isinstance(d, Exception) for d in decode_unrolls(payloads, uspec))
    decoded = time.perf_counter()
    steps = uspec.unroll_length * len(unrolls)
    n = len(unrolls)
    return sum(map(len, payloads)) / steps, 1e6 * (encoded - start) / n, 1e6 * (decoded - encoded) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--unrolls", type=int, default=64, help="unrolls per game")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 3, 9], help="zstd levels to compare")
    parser.add_argument("--per-entry", type=int, nargs="+", default=[1, 8], help="unrolls per stream entry")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'game':26s} {'setting':10s} {'bytes/step':>11s} {'vs raw':>7s} {'encode µs':>10s} {'decode µs':>10s}"
          "   (per unroll)")
    for game, (config, overrides) in GAMES.items():
        unrolls, uspec = actor_unrolls(config, overrides, args.unrolls)
        raw = None
        for per_entry in args.per_entry:
            for compression, level in [("none", 0), *(("zstd", lv) for lv in args.levels)]:
                per_step, enc, dec = measure(unrolls, uspec, compression, level or 1, per_entry)
                raw = raw or per_step
                setting = ("none" if compression == "none" else f"zstd:{level}") + f" x{per_entry}"
                print(f"{game:26s} {setting:10s} {per_step:11,.1f} {per_step / raw:7.3f} {enc:10,.0f} {dec:10,.0f}")
        print(f"{'':26s} T={uspec.unroll_length}, {len(unrolls)} unrolls of one actor")


if __name__ == "__main__":
    main()
