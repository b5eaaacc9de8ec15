"""Reading what a training run left in its directory: config, metrics records, league files.

A run directory holds `config.yaml`, `metrics.jsonl` (one JSON record per `run.log_every_s`, written
by the learner: `time` in Unix seconds, `elapsed_s` (training seconds of the whole run, continued by a
resume), `learner_started` (when the learner process that wrote it started: it changes at a resume),
`agent_steps_trained`, `sps`, `policy_lag`, losses, episode outcomes...), `evaluation.json` (the final
evaluation of `run.py train`), and with a league `league/ratings.jsonl` and `league/state.json`. Files
written under older key names (`frames`) read under the names now (`records.upgraded`).
Also here: the listing of `run.py runs`, local run directories and the runs in a shared Redis.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from impala_league.checked_config import from_yaml_text
from impala_league.config import Config, ConfigError
from impala_league.distributed.launch.ownership import lock_holder
from impala_league.distributed.wire import keys as run_keys
from impala_league.records import upgraded

EVALUATION_FILE = "evaluation.json"

# The learning-progress metric, in order of preference: score against league members and bots,
# then the return of the learning seat (the score of single-agent envs).
SCORE_KEYS = ("league_score", "episode_return")


@dataclass
class Run:
    """One run directory: `records` are the metrics lines in order; `start` (Unix s) is when the
    run began (the `started` file `run.py compare` writes, else the first record's time less its
    `elapsed_s`); `evaluation` is its evaluation.json (None without one)."""

    path: Path
    config: Config
    records: list[dict]
    start: float
    evaluation: dict | None = None
    from_started_file: bool = False

    @property
    def name(self) -> str:
        return self.path.name

    def elapsed(self, record: dict) -> float:
        """Seconds of the run at `record`: its training time (`elapsed_s`, which a resume continues, so
        the time the run was stopped is left out), else the seconds since the start (never negative)."""
        if "elapsed_s" in record and not self.from_started_file:
            return float(record["elapsed_s"])
        return max(0.0, float(record["time"]) - self.start)

    def segments(self, records: list[dict] | None = None) -> list[list[dict]]:
        """`records` (default all) split where a resumed learner took over (`learner_started` changes):
        one list per learner process, to be drawn as separate lines."""
        out: list[list[dict]] = []
        for r in self.records if records is None else records:
            if not out or r.get("learner_started") != out[-1][-1].get("learner_started"):
                out.append([])
            out[-1].append(r)
        return out


def load_run(path: str | Path) -> Run:
    """Read a run directory. Raises ConfigError (naming the file) if it is not one."""
    path = Path(path)
    config_file, metrics_file = path / "config.yaml", path / "metrics.jsonl"
    if not config_file.is_file():
        raise ConfigError(f"{path} is not a run directory: it has no config.yaml")
    config = from_yaml_text(config_file.read_text())
    records = []
    if metrics_file.is_file():
        for n, line in enumerate(metrics_file.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(upgraded(json.loads(line)))
            except json.JSONDecodeError:
                raise ConfigError(f"{metrics_file}:{n} is not JSON") from None
    started = path / "started"
    if started.is_file():  # `run.py compare`: its runs are never resumed
        start = float(started.read_text())
    elif records:
        start = float(records[0]["time"]) - float(records[0].get("elapsed_s", 0.0))
    else:
        start = config_file.stat().st_mtime
    evaluation_file = path / EVALUATION_FILE
    evaluation = upgraded(json.loads(evaluation_file.read_text())) if evaluation_file.is_file() else None
    return Run(path, config, records, start, evaluation, started.is_file())


def score_key(records: list[dict], wanted: str = "auto") -> str | None:
    """The metric that measures learning in `records`: `wanted`, or with "auto" the first of
    SCORE_KEYS that some record has. None if there is none."""
    keys = SCORE_KEYS if wanted == "auto" else (wanted,)
    return next((k for k in keys if any(k in r for r in records)), None)


def read_jsonl(path: Path) -> list[dict]:
    """Lines of a JSONL file that parse (a line being written when the run was stopped may not)."""
    out = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                out.append(upgraded(json.loads(line)))
            except json.JSONDecodeError:
                continue
    return out


def list_run_dirs(base: Path) -> list[dict]:
    """Every run directory under `base` (one with a config.yaml): name, env, state and agent steps trained. The
    state: `live (host pid N)` while a process holds its lock (distributed/launch/ownership.py), `finished`
    when its checkpoint says the learner reached the end, else `stopped` (resumable with a
    checkpoint) or `no checkpoint`."""
    rows = []
    for path in sorted(p.parent for p in base.glob("*/config.yaml")) if base.is_dir() else []:
        meta_file = path / "checkpoints" / "latest.json"
        try:
            meta = upgraded(json.loads(meta_file.read_text())) if meta_file.is_file() else None
            env = from_yaml_text((path / "config.yaml").read_text()).env.name
        except (ValueError, ConfigError, OSError):
            meta, env = None, "?"
        owner = lock_holder(path)
        state = (f"live ({owner})" if owner else "finished" if meta and meta.get("finished")
                 else "stopped" if meta else "no checkpoint")
        rows.append({"name": path.name, "path": str(path), "env": env, "state": state,
                     "agent_steps_trained": int(meta["agent_steps_trained"]) if meta else 0})
    return rows


# A run is live while one of these leases is held; `{run}:{P}:learner` are the exploiters' own.
LIVE_SUFFIXES = (":launcher", ":learner", ":league")


def _run_keys(client, run: str) -> list[bytes]:
    """Every key of `run`: `{run}:*`, and its trajectory shards s > 0, `{<run>:s<s>}:*` (transport.shard_namespace)."""
    return list(client.scan_iter(match=f"{run}:*", count=1000)) + list(
        client.scan_iter(match=f"{{{run}:*", count=1000))


def list_redis_runs(client) -> list[dict]:
    """The runs that have keys in a shared Redis (a run name is the part of a key before its first
    ':', without the `{` of a shard's hash tag): name, state (`live (holder)`, `finished`, `stopped`), number of keys and their bytes
    (MEMORY USAGE; 0 where Redis refuses it)."""
    by_run: dict[str, list[bytes]] = {}
    for key in client.scan_iter(count=1000):
        name = key.split(b":", 1)[0].lstrip(b"{").decode(errors="replace")  # `{run:s1}:traj`: a shard's key
        by_run.setdefault(name, []).append(key)
    rows = []
    for name, keys in sorted(by_run.items()):
        live = [k for k in keys if k.decode(errors="replace").endswith(LIVE_SUFFIXES)]
        holder = (client.get(live[0]) or b"?").decode(errors="replace") if live else None
        size = 0
        for key in keys:
            try:
                size += client.memory_usage(key) or 0
            except Exception:  # noqa: BLE001 (an ACL user may not run MEMORY; the size is only shown)
                break
        state = f"live ({holder})" if live else "finished" if run_keys.done(name).encode() in keys else "stopped"
        rows.append({"name": name, "state": state, "keys": len(keys), "bytes": size})
    return rows


class RunIsLive(ConfigError):
    """A run whose keys were to be deleted is live; the message names who holds it."""


def delete_run_keys(client, run: str) -> int:
    """Delete every key of run `run` (`{run}:*` and its shards' `{<run>:s<s>}:*`) from a shared Redis (only
    this one: shards on other servers, transport.shard_urls, are not reached); returns how many. Raises
    RunIsLive while a launcher, learner or league manager of the run holds its lease."""
    keys = _run_keys(client, run)
    live = [k for k in keys if k.decode(errors="replace").endswith(LIVE_SUFFIXES)]
    if live:
        holder = (client.get(live[0]) or b"?").decode(errors="replace")
        raise RunIsLive(f"run '{run}' is live ({live[0].decode()} is held by {holder}); stop it first")
    if not keys:
        raise ConfigError(f"no keys of run '{run}' in this Redis; `run.py runs --redis-url URL` lists the runs")
    for i in range(0, len(keys), 500):
        client.delete(*keys[i:i + 500])
    return len(keys)
