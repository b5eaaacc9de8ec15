"""The league manager process: a `LeagueState` (league/state.py) fed from Redis, its decisions written
to Redis and the run directory.

One pass every `league.manager_every_s` seconds:
  1. read new episode results (consumer group `league` on `{run}:results`) into the state's payoff and
     Elo ratings (only games one opponent version played throughout, see league/state.py `single_opponent`);
  2. freeze snapshots of learners that are due (`LeagueState.due_snapshot`): the learner's published
     weights become a checkpoint file and Redis weights; reset exploiters that earned it;
  3. publish each learner's opponent distribution (league/matchmaking.py) for its actors;
  4. choose the snapshots whose weights Redis holds, at most `league.redis_snapshots`, evicting and
     loading back from files (league/residency.py);
  5. write the league state (`<run dir>/league/state.json`, atomically) and a ratings history line, at
     every pass while that is cheap, else so that saving takes at most SAVE_DUTY of the time (5,000
     players: megabytes of JSON); every 30 s, measure the run directory and Redis against their
     budgets (league/usage.py).

Snapshots are checkpoint files (`league/snapshots/<id>.safetensors`, loadable by `load_policy`), every
one a member for the run's life, and weights in Redis for the actors while resident. `--resume` reloads
the state, adopts snapshot files written after the state was last saved, and fills Redis again.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError

from impala_league.agents.checkpoint import CheckpointError, read_meta, save_checkpoint
from impala_league.agents.model import make_model
from impala_league.config import Config, ConfigError, to_yaml, without_secrets
from impala_league.distributed.launch.ownership import owns_run_dir, run_role
from impala_league.distributed.wire import keys
from impala_league.distributed.wire.codec import WeightsCorrupt, decode_weights
from impala_league.distributed.wire.params import ParamStore
from impala_league.distributed.wire.transport import LearnerLease, ResultsStream, connect, run_is_over
from impala_league.envs.registry import env_spec
from impala_league.league.players import SNAPSHOT_ID, learner_players, namespace
from impala_league.league.residency import SnapshotResidency
from impala_league.league.state import LeagueState, Member
from impala_league.league.store import LeagueStore
from impala_league.league.usage import RATINGS_MAX_BYTES, Usage, thin_jsonl

log = logging.getLogger("league")

GROUP = "league"
SAVE_DUTY = 0.1
"""After a save that took s seconds the next waits s / SAVE_DUTY: results stay unacknowledged until then
(a crash reads them again), snapshot files are adopted on resume (`adopt_snapshot_files`)."""
RATINGS_EVERY_S = 10.0
"""ratings.jsonl gains a line at a save at most this often."""


@dataclass
class PassClock:
    """How long the manager's passes and saves take, and when it saves next (seconds)."""

    pass_s: float = 0.0  # the last pass's steps 1-4
    pass_s_max: float = 0.0  # the longest of them
    save_s: float = 0.0  # the last save
    next_save: float = 0.0  # monotonic time before which `one_pass` does not save (SAVE_DUTY)
    last_ratings: float = 0.0  # unix time of the last ratings.jsonl line


class LeagueManager:
    """The league process of one run: `state` (a LeagueState) fed with the results and weights in Redis;
    what it decides written to Redis (snapshot weights, distributions, resets) and to the run directory
    (snapshot files, state.json, ratings.jsonl). `run` loops until the run is over or a stop signal.

    Raises ConfigError when the run directory holds a league already and `resume` is False, and
    CheckpointError when `resume` finds a state.json it cannot use (see `load`).
    """

    def __init__(self, cfg: Config, redis_url: str, run_dir: Path, resume: bool = False):
        self.cfg = cfg
        league = cfg.league
        self.spec = env_spec(cfg.env.name, cfg.env.kwargs, cfg.env.seats)
        learners = learner_players(cfg)
        self.state = LeagueState(league, learners, self.spec.name, len(self.spec.seats), cfg.run.seed)
        self.state_path = Path(run_dir) / "league" / "state.json"
        self.redis = connect(redis_url, retry_s=cfg.run.redis_retry_s)
        self.store = LeagueStore(self.redis, cfg.run.name)
        self.results = ResultsStream(self.redis, cfg.run.name)
        self.params = {p: ParamStore(self.redis, namespace(cfg.run.name, p)) for p in learners}
        self.residency = SnapshotResidency(self.store, self.state_path.parent / "snapshots", league.redis_snapshots)
        self.usage = Usage(Path(run_dir), league.disk_budget_mb, league.redis_budget_mb)
        self.clock = PassClock()
        self.stopping = False
        self.stop_signal: int | None = None  # the signal that asked it to stop (SIGTERM, SIGINT), if one did
        self.unacked: list[bytes] = []  # results folded in but not yet saved: acknowledged after `save`
        self.lease: LearnerLease | None = None  # the run's league lease, held while `run` runs
        if resume and self.state_path.exists():
            self.load()
        elif resume:
            log.warning("--resume: no league state at %s; starting a new league", self.state_path)
        elif self.state_path.exists():
            raise ConfigError(f"{self.state_path} holds a league already: pass --resume to continue it, or give "
                              "another run directory (a new league would overwrite it)")

    @property
    def payoff(self):
        """The state's payoff table (league/payoff.py `PayoffTable`), kept under the manager's name for callers."""
        return self.state.payoff

    def stop(self, signum: int | None = None, _frame: object = None) -> None:
        """Stop after the current round; a signal handler (`signum`: the signal, kept for the exit code)."""
        self.stopping = True
        self.stop_signal = self.stop_signal or signum

    # -- results -----------------------------------------------------------------------------------
    def consume_results(self, pending: bool = False) -> int:
        """Fold new episode results (with `pending`: those read before a crash and never saved) into
        the payoff and ratings; returns how many counted. They are acknowledged after the next `save`."""
        ids, results = self.results.read_group(GROUP, "manager", pending=pending)
        counted = self.state.score(results, unreadable=len(ids) - len(results), evicted=self.residency.evicted_ever)
        self.unacked += ids
        return counted

    # -- snapshots and resets ----------------------------------------------------------------------
    def take_snapshot(self, player: str, reason: str) -> str | None:
        """Freeze `player`'s latest published weights: a file, Redis weights, a member. Returns its id,
        or None when there is nothing new to freeze or the weights cannot be (logged)."""
        try:
            fetched = self.params[player].fetch_raw()
        except WeightsCorrupt as e:  # counted by the store; the next pass tries the next publish
            log.error("no snapshot of %s this pass: %s", player, e)
            return None
        if fetched is None:
            return None
        step, data, agent_steps = fetched
        member = self.state.new_snapshot(player, step, agent_steps, time.time())
        if member is None:
            return None
        model = make_model(self.spec, self.cfg.agent)
        try:
            model.load_state_dict(decode_weights(data))
        except (RuntimeError, SafetensorError) as e:
            log.error("cannot snapshot %s: its published weights do not fit its config (%s)", player,
                      str(e).splitlines()[0])
            return None
        path = self.residency.path(member.id)
        try:
            save_checkpoint(path, model, None, to_yaml(without_secrets(self.cfg)), member.to_json())
        except (OSError, SafetensorError) as e:  # a full disk: the partial file is removed, older ones are whole
            log.error("no snapshot of %s this pass: writing %s failed (%s); the next pass tries again", player,
                      path, e)
            return None
        self.residency.make_room(*self.state.residency_inputs())
        self.store.put_snapshot(member.id, data)
        self.state.add_snapshot(member)
        log.info("snapshot %s (%s; Elo %.0f)", member.id, reason, self.state.elo.get(player).elo)
        return member.id

    def reset(self, player: str, step: int) -> None:
        """Ask `player`'s learner to start again from fresh weights; forget its results."""
        count = self.store.request_reset(player)
        self.state.reset(player, step)
        log.info("reset %s (reset %d)", player, count)

    def snapshot_due_learners(self) -> None:
        """Snapshot every learner whose snapshot is due at its published version, and reset it where its
        role says so (`LeagueState.resets_after_snapshot`)."""
        for player in self.state.learners:
            step = self.params[player].version()
            reason = self.state.due_snapshot(player, step) if step > 0 else None
            if reason is None or self.take_snapshot(player, reason) is None:
                continue
            if self.state.resets_after_snapshot(player):
                self.reset(player, step)

    # -- matchmaking -------------------------------------------------------------------------------
    def publish(self) -> dict[str, dict[str, float]]:
        """Compute and publish every learner's opponent distribution; returns them (also `state.distributions`)."""
        distributions = self.state.update_distributions()
        for player, dist in distributions.items():
            self.store.publish_opponents(player, dist)
        return distributions

    # -- which snapshots Redis holds ---------------------------------------------------------------
    def rebalance_snapshots(self, fill: bool = False) -> None:
        """Take the actors' asks, then make Redis hold the chosen snapshots (league/residency.py), with
        `fill` all of them at once (the first pass: a resumed league's Redis may be empty), else a few
        (residency.LOADS_PER_PASS, LOAD_BUDGET_S). A snapshot whose file cannot be loaded leaves the league,
        the reason logged."""
        self.residency.take_wants(set(self.state.snapshots()))
        for snapshot_id, why in self.residency.rebalance(*self.state.residency_inputs(), fill=fill).items():
            self.drop(snapshot_id, why)

    def drop(self, snapshot_id: str, why: str) -> None:
        """Remove a snapshot whose file is missing or corrupt from the league; the run goes on."""
        log.error("snapshot %s leaves the league: %s", snapshot_id, why)
        self.state.drop(snapshot_id, why)
        self.residency.wanted.pop(snapshot_id, None)

    # -- persistence -------------------------------------------------------------------------------
    def state_json(self) -> dict:
        """What state.json holds: the league's state (`LeagueState.to_json`), the residency's counters,
        and the latest pass time and usage measurement."""
        clock = self.clock
        return {**self.state.to_json(), "residency": self.residency.to_json(),
                "pass_s": round(clock.pass_s, 4), "pass_s_max": round(clock.pass_s_max, 4),
                "save_s": round(clock.save_s, 4), "usage": self.usage.last, "time": time.time()}

    def save(self) -> None:
        """Write state.json atomically, then acknowledge the results it holds; every RATINGS_EVERY_S append
        the ratings to ratings.jsonl (thinned past RATINGS_MAX_BYTES: league/usage.py). A crash loses no
        result: unacknowledged ones are read again on resume. A failed write (a full disk) is logged and
        leaves the previous state.json whole; its results wait for the next save. Writes nothing once
        the launcher that owned the run directory is gone."""
        if not owns_run_dir():
            return
        tmp = self.state_path.with_suffix(".json.tmp")
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self.state_json(), separators=(",", ":")) + "\n")
            os.replace(tmp, self.state_path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            log.error("league state not written to %s (%s); the next pass tries again", self.state_path, e)
            return
        self.results.ack(GROUP, self.unacked)
        self.unacked = []
        if time.time() - self.clock.last_ratings >= RATINGS_EVERY_S:
            self.clock.last_ratings = time.time()
            path = self.state_path.parent / "ratings.jsonl"
            try:
                with path.open("a") as f:
                    f.write(json.dumps(self.state.ratings_record(time.time())) + "\n")
                thin_jsonl(path, RATINGS_MAX_BYTES)
            except OSError as e:
                log.error("ratings not written to %s: %s", path, e)

    def adopt_snapshot_files(self) -> list[str]:
        """Make members of the snapshot files the saved state does not name: written by a manager killed
        before its next save. Their record is the one saved in the file's metadata. Returns their ids."""
        adopted = []
        for path in sorted(self.residency.snapshot_dir.glob("*.safetensors")):
            snapshot_id = path.name[:-len(".safetensors")]
            if (snapshot_id in self.state.members or snapshot_id in self.state.dropped
                    or not SNAPSHOT_ID.fullmatch(snapshot_id)):
                continue
            try:
                info = read_meta(path)
                member = Member.from_json(snapshot_id, info)
                if info.get("id") != snapshot_id or member.kind != "snapshot":
                    raise ValueError(f"it names {info.get('id')!r} of player {info.get('player')!r}")
                self.state.add_snapshot(member)
            except (CheckpointError, ValueError) as e:
                log.error("snapshot file %s is not adopted into the league: %s", path, e)
                continue
            adopted.append(snapshot_id)
        if adopted:
            log.warning("adopted %d snapshot files written after the league state was last saved: %s", len(adopted),
                        ", ".join(adopted))
        return adopted

    def load(self) -> None:
        """Restore state.json and adopt the snapshot files it does not name. Redis is filled with the
        chosen snapshots by `run`'s first pass, once the manager holds the run's lease (league/residency.py).

        A snapshot whose file is missing (now) or corrupt (when it is loaded) leaves the league with an
        error naming it. Raises CheckpointError when state.json itself is unreadable or of another env.
        """
        try:
            saved = json.loads(self.state_path.read_text())
            self.state.restore(saved)
            residency = dict(saved.get("residency", {}))
        except (OSError, ValueError, TypeError, AttributeError) as e:
            raise CheckpointError(f"--resume: league state {self.state_path} is not usable: {e}") from None
        self.adopt_snapshot_files()
        for snapshot_id in self.state.snapshots():
            if not self.residency.path(snapshot_id).is_file():
                self.drop(snapshot_id, f"checkpoint not found: {self.residency.path(snapshot_id)}")
        self.residency.restore(residency, set(self.state.snapshots()))
        log.info("league resumed from %s: %d snapshots, %d games", self.state_path, len(self.state.snapshots()),
                 self.state.games)

    # -- loop --------------------------------------------------------------------------------------
    def one_pass(self) -> None:
        """Steps 1-5 of the module docstring. `clock.pass_s` times steps 1-4 (results, payoff, Elo,
        snapshots, PFSP, distributions, residency), `clock.save_s` step 5's state and ratings (when it saved)."""
        start = time.perf_counter()
        self.consume_results()
        self.snapshot_due_learners()
        self.publish()
        self.rebalance_snapshots()
        clock = self.clock
        clock.pass_s = time.perf_counter() - start
        clock.pass_s_max = max(clock.pass_s_max, clock.pass_s)
        if time.monotonic() >= clock.next_save:
            start = time.perf_counter()
            self.save()
            clock.save_s = time.perf_counter() - start
            clock.next_save = time.monotonic() + clock.save_s / SAVE_DUTY
        if self.usage.due(time.monotonic()):
            self.usage.check(self.redis, time.monotonic(), time.time())

    def run(self) -> None:
        """Hold the run's league lease, then pass every `league.manager_every_s` until the run is done or
        `stop`; the state is saved at the end and the lease released."""
        done_key = keys.done(self.cfg.run.name)
        self.lease = LearnerLease(self.redis, self.cfg.run.name, f"{socket.gethostname()} pid {os.getpid()}",
                                  role="league", ttl_s=self.cfg.run.lease_ttl_s)
        if not self.lease.acquire(should_stop=lambda: self.stopping):
            return
        self.consume_results(pending=True)
        self.publish()
        self.rebalance_snapshots(fill=True)
        self.save()
        log.info("league manager (pid %d): learners %s, bots %s; Redis holds at most %d snapshots", os.getpid(),
                 ", ".join(self.state.learners), ", ".join(self.cfg.league.bots) or "none", self.residency.capacity)
        while not self.stopping:
            self.one_pass()
            if self.redis.exists(done_key):
                break
            deadline = time.monotonic() + self.cfg.league.manager_every_s
            while not self.stopping and time.monotonic() < deadline:
                time.sleep(0.1)
        self.consume_results()
        self.save()
        self.lease.release()
        log.info("league: %d snapshots, %d games scored; top: %s", len(self.state.snapshots()), self.state.games,
                 ", ".join(f"{m} {r.elo:.0f}±{r.uncertainty:.0f}" for m, r in
                           sorted(self.state.elo.ratings.items(), key=lambda kv: -kv[1].elo)[:5]))


def run_league(cfg: Config, redis_url: str, run_dir: Path, resume: bool = False) -> int:
    """Entry point of `run.py league`: stop cleanly (state written) on SIGTERM/SIGINT. Returns the exit
    code: 0 once the run is over, 128 + N when signal N stopped it before (`stopped_exit_code`). Raises
    RedisUnavailable when Redis stays lost (the state written first)."""
    torch.set_num_threads(1)
    manager = LeagueManager(cfg, redis_url, run_dir, resume)

    def lost_redis(e: Exception) -> str:
        manager.save()
        return f"the league manager lost Redis ({type(e).__name__}: {e}); state written to {manager.state_path}"

    return run_role(manager, lost_redis, lambda: run_is_over(manager.redis, cfg.run.name))
