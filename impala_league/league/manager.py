"""The league manager process: payoff and ratings from episode results, snapshots, opponent distributions.

One pass every `league.manager_every_s` seconds:
  1. read new episode results (consumer group `league` on `{run}:results`) into the payoff table and
     the Elo ratings (only games one opponent version played throughout, see `single_opponent`);
  2. freeze snapshots of learners that are due (see `due_snapshot`), reset exploiters that earned it;
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
import math
import os
import re
import random
import socket
import time
from pathlib import Path

import torch
from safetensors import SafetensorError

from impala_league.agents.checkpoint import CheckpointError, read_meta, save_checkpoint
from impala_league.agents.model import make_model
from impala_league.config import Config, ConfigError, to_yaml, without_secrets
from impala_league.distributed.wire import keys
from impala_league.distributed.wire.codec import WeightsCorrupt, decode_weights
from impala_league.distributed.ownership import owns_run_dir, run_role
from impala_league.distributed.wire.params import ParamStore
from impala_league.distributed.wire.transport import LearnerLease, ResultsStream, connect, run_is_over
from impala_league.envs.registry import env_spec
from impala_league.league.matchmaking import SELF, league_exploiter_opponents, main_agent_opponents, main_exploiter_opponents
from impala_league.league.payoff import EloRatings, PayoffTable, episode_score
from impala_league.league.players import MAIN, PLAYER_ID, SNAPSHOT_ID, learner_players, namespace, role
from impala_league.league.residency import SnapshotResidency
from impala_league.league.store import LeagueStore
from impala_league.league.usage import RATINGS_MAX_BYTES, Usage, thin_jsonl

log = logging.getLogger("league")

GROUP = "league"
STATE_VERSION = 1
SAVE_DUTY = 0.1
"""After a save that took s seconds the next waits s / SAVE_DUTY: results stay unacknowledged until then
(a crash reads them again), snapshot files are adopted on resume (`adopt_snapshot_files`)."""


def single_opponent(result: dict) -> bool:
    """Was the result's game played by one opponent version throughout? Actors pin the opponent's
    weights for a whole game and name them in `opponent_version`: the snapshot id or bot spec itself,
    or `<learner>@<version>`. A result without it (or naming another opponent) is not scored."""
    opponent, version = result.get("opponent_id"), result.get("opponent_version")
    if not isinstance(opponent, str) or not isinstance(version, str):
        return False
    if PLAYER_ID.fullmatch(opponent):  # a learner: its weights change, so the version is required
        return re.fullmatch(rf"{re.escape(opponent)}@\d+", version) is not None
    return version == opponent


def _check_members(members: dict[str, dict]) -> None:
    """Raise ValueError unless every saved member is a well-formed snapshot, learner or bot."""
    for member, info in members.items():
        kind = info.get("kind")
        if kind == "snapshot":
            if not SNAPSHOT_ID.fullmatch(member) or not PLAYER_ID.fullmatch(str(info.get("player"))):
                raise ValueError(f"snapshot {member!r} has a malformed id or player")
        elif kind not in ("learner", "bot"):
            raise ValueError(f"member {member!r} has no valid kind")


class LeagueManager:
    """Owns the league state of one run. `run` loops until the run is over or a stop signal.

    Members (`self.members`, id -> info dict): `kind` is `learner`, `snapshot` or `bot`; snapshots
    also hold `player` (the learner frozen), `role`, `step` (its update), `frames`, `parent` (the
    previous snapshot of that learner, None after a reset) and `created` (unix seconds).
    """

    def __init__(self, cfg: Config, redis_url: str, run_dir: Path, resume: bool = False):
        self.cfg = cfg
        league = cfg.league
        self.dir = Path(run_dir) / "league"
        self.snapshot_dir = self.dir / "snapshots"
        self.state_path = self.dir / "state.json"
        self.spec = env_spec(cfg.env.name, cfg.env.kwargs, cfg.env.seats)
        self.learners = learner_players(cfg)
        self.payoff = PayoffTable(decay=league.payoff_decay, min_games=league.min_games)
        self.elo = EloRatings(k=league.elo_k)
        self.members: dict[str, dict] = {p: {"kind": "learner", "role": role(p)} for p in self.learners}
        self.members.update({b: {"kind": "bot"} for b in league.bots})
        self.last_snapshot = {p: 0 for p in self.learners}  # update step of the latest snapshot (or reset)
        self.lineage: dict[str, str | None] = {p: None for p in self.learners}
        self.games = self.skipped = 0
        self.rng = random.Random(cfg.run.seed)
        self.redis = connect(redis_url, retry_s=cfg.run.redis_retry_s)
        self.store = LeagueStore(self.redis, cfg.run.name)
        self.results = ResultsStream(self.redis, cfg.run.name)
        self.params = {p: ParamStore(self.redis, namespace(cfg.run.name, p)) for p in self.learners}
        self.residency = SnapshotResidency(self.store, self.snapshot_dir, league.redis_snapshots)
        self.usage = Usage(Path(run_dir), league.disk_budget_mb, league.redis_budget_mb)
        self.dropped: dict[str, str] = {}  # snapshots that left the league (file missing or corrupt): id -> why
        self.evicted_games = 0  # games scored against a snapshot that had been evicted from Redis before
        self.distributions: dict[str, dict[str, float]] = {}  # as last published
        self.pass_s = self.pass_s_max = self.save_s = 0.0  # seconds of the last pass, the longest, the last save
        self.next_save = 0.0  # monotonic time before which `one_pass` does not save (SAVE_DUTY)
        self.stopping = False
        self.stop_signal: int | None = None  # the signal that asked it to stop (SIGTERM, SIGINT), if one did
        self.unacked: list[bytes] = []  # results folded in but not yet saved: acknowledged after `save`
        self.last_ratings = 0.0
        if resume and self.state_path.exists():
            self.load()
        elif resume:
            log.warning("--resume: no league state at %s; starting a new league", self.state_path)
        elif self.state_path.exists():
            raise ConfigError(f"{self.state_path} holds a league already: pass --resume to continue it, or give "
                              "another run directory (a new league would overwrite it)")

    def stop(self, signum: int | None = None, _frame: object = None) -> None:
        """Stop after the current round; a signal handler (`signum`: the signal, kept for the exit code)."""
        self.stopping = True
        self.stop_signal = self.stop_signal or signum

    # -- members -----------------------------------------------------------------------------------
    def snapshots(self, player: str | None = None) -> list[str]:
        return [m for m, info in self.members.items()
                if info["kind"] == "snapshot" and (player is None or info["player"] == player)]

    def frozen(self) -> list[str]:
        """The league that PFSP draws from: every snapshot and every bot."""
        return [m for m, info in self.members.items() if info["kind"] in ("snapshot", "bot")]

    # -- results -----------------------------------------------------------------------------------
    def consume_results(self, pending: bool = False) -> int:
        """Fold new episode results (with `pending`: those read before a crash and never saved) into
        the payoff and ratings; returns how many counted. They are acknowledged after the next `save`."""
        ids, results = self.results.read_group(GROUP, "manager", pending=pending)
        counted = 0
        for r in results:
            player, opponent = r.get("player", MAIN), r.get("opponent_id", SELF)
            if opponent == SELF:
                continue  # self-play says nothing about who is stronger
            if r.get("nonfinite"):  # a NaN or infinite return decides no game
                self.skipped += 1
                continue
            if (player not in self.learners or opponent not in self.members or player == opponent
                    or not single_opponent(r)):
                self.skipped += 1
                continue
            score = episode_score(r)
            seat = r.get("learner_seat", -1)
            self.payoff.add(player, opponent, score, seat if isinstance(seat, int) and 0 <= seat < len(self.spec.seats)
                            else None)
            self.elo.update(player, opponent, score)
            counted += 1
            self.evicted_games += opponent in self.residency.evicted_ever
        self.skipped += len(ids) - len(results)
        self.unacked += ids
        self.games += counted
        return counted

    # -- snapshots and resets ----------------------------------------------------------------------
    def due_snapshot(self, player: str, step: int) -> str | None:
        """Why `player` at update `step` should be frozen now, or None.

        main: every `snapshot_every` updates, or when it beats every frozen member at
        `snapshot_win_rate` (win rates below `min_games` games do not count).
        main exploiter: when it beats the main agent at `exploiter_reset_win_rate`, or 2 x
        `snapshot_every` updates after its last reset; it is then reset.
        league exploiter: when it beats every frozen member at `snapshot_win_rate`, or 2 x
        `snapshot_every` updates; then reset with probability `league_exploiter_reset_prob`.
        """
        league = self.cfg.league
        since = step - self.last_snapshot[player]
        if since <= 0:
            return None
        kind = role(player)
        period = league.snapshot_every * (1 if kind == MAIN else 2)
        if since >= period:
            return f"{since} updates since the last snapshot"
        if kind == "main_exploiter":
            w = self.payoff.win_rate(player, MAIN)
            if w is not None and w >= league.exploiter_reset_win_rate:
                return f"beats the main agent {w:.0%}"
            return None
        others = self.frozen()
        rates = [self.payoff.win_rate(player, m) for m in others]
        if others and all(w is not None and w >= league.snapshot_win_rate for w in rates):
            return f"beats all {len(others)} league members at >= {league.snapshot_win_rate:.0%}"
        return None

    def take_snapshot(self, player: str, reason: str) -> str | None:
        """Freeze `player`'s latest published weights: a file, Redis weights, a member. Returns its id."""
        try:
            fetched = self.params[player].fetch_raw()
        except WeightsCorrupt as e:  # counted by the store; the next pass tries the next publish
            log.error("no snapshot of %s this pass: %s", player, e)
            return None
        if fetched is None:
            return None
        step, data, frames = fetched
        snapshot_id = f"{player}-{step:07d}"
        if snapshot_id in self.members:
            return None
        model = make_model(self.spec, self.cfg.agent)
        try:
            model.load_state_dict(decode_weights(data))
        except (RuntimeError, SafetensorError) as e:
            log.error("cannot snapshot %s: its published weights do not fit its config (%s)", player,
                      str(e).splitlines()[0])
            return None
        info = {"kind": "snapshot", "id": snapshot_id, "player": player, "role": role(player), "step": step,
                "frames": frames, "parent": self.lineage[player], "created": time.time()}
        path = self.residency.path(snapshot_id)
        try:
            save_checkpoint(path, model, None, to_yaml(without_secrets(self.cfg)), info)
        except (OSError, SafetensorError) as e:  # a full disk: the partial file is removed, older ones are whole
            log.error("no snapshot of %s this pass: writing %s failed (%s); the next pass tries again", player,
                      path, e)
            return None
        self.residency.make_room(*self.residency_inputs())
        self.store.put_snapshot(snapshot_id, data)
        self.members[snapshot_id] = info
        self.elo.copy_to(player, snapshot_id)
        self.last_snapshot[player] = step
        self.lineage[player] = snapshot_id
        log.info("snapshot %s (%s; Elo %.0f)", snapshot_id, reason, self.elo.get(player).elo)
        return snapshot_id

    def reset(self, player: str, step: int) -> None:
        """Ask `player`'s learner to start again from fresh weights; forget its results."""
        count = self.store.request_reset(player)
        self.payoff.remove(player)
        self.elo.ratings.pop(player, None)
        self.last_snapshot[player] = step
        self.lineage[player] = None
        log.info("reset %s (reset %d)", player, count)

    def snapshot_due_learners(self) -> None:
        for player in self.learners:
            step = self.params[player].version()
            reason = self.due_snapshot(player, step) if step > 0 else None
            if reason is None or self.take_snapshot(player, reason) is None:
                continue
            kind = role(player)
            if kind == "main_exploiter" or (
                    kind == "league_exploiter" and self.rng.random() < self.cfg.league.league_exploiter_reset_prob):
                self.reset(player, step)

    # -- matchmaking -------------------------------------------------------------------------------
    def distribution(self, player: str) -> dict[str, float]:
        kind = role(player)
        if kind == MAIN:
            return main_agent_opponents(player, self.payoff, self.frozen(), self.snapshots(player), self.cfg.league,
                                        self.cfg.league.bots)
        if kind == "main_exploiter":
            return main_exploiter_opponents(player, self.payoff, self.snapshots(MAIN), self.cfg.league)
        return league_exploiter_opponents(player, self.payoff, self.frozen(), self.cfg.league)

    def publish(self) -> dict[str, dict[str, float]]:
        """Compute and publish every learner's opponent distribution; returns them (also `distributions`)."""
        self.distributions = {p: self.distribution(p) for p in self.learners}
        for player, dist in self.distributions.items():
            self.store.publish_opponents(player, dist)
        return self.distributions

    # -- which snapshots Redis holds ---------------------------------------------------------------
    def residency_inputs(self) -> tuple[dict[str, float], list[str], dict[str, float]]:
        """(every snapshot's creation time, the newest snapshot of each learner, each snapshot's summed
        probability in the published distributions), as league/residency.py takes them."""
        created, newest = {}, {}
        for member, info in self.members.items():
            if info["kind"] == "snapshot":
                created[member] = float(info.get("created", 0.0))
                if info["step"] >= self.members.get(newest.get(info["player"]), {}).get("step", -1):
                    newest[info["player"]] = member
        weights: dict[str, float] = {}
        for dist in self.distributions.values():
            for opponent, p in dist.items():
                if opponent in created:
                    weights[opponent] = weights.get(opponent, 0.0) + p
        return created, [newest[p] for p in self.learners if p in newest], weights

    def rebalance_snapshots(self, fill: bool = False) -> None:
        """Take the actors' asks, then make Redis hold the chosen snapshots (league/residency.py), with
        `fill` all of them at once (the first pass: a resumed league's Redis may be empty), else a few
        (residency.LOADS_PER_PASS, LOAD_BUDGET_S). A snapshot whose file cannot be loaded leaves the league, the reason logged."""
        self.residency.take_wants({m for m, info in self.members.items() if info["kind"] == "snapshot"})
        for snapshot_id, why in self.residency.rebalance(*self.residency_inputs(), fill=fill).items():
            self.drop(snapshot_id, why)

    def drop(self, snapshot_id: str, why: str) -> None:
        """Remove a snapshot whose file is missing or corrupt from the league; the run goes on."""
        log.error("snapshot %s leaves the league: %s", snapshot_id, why)
        self.members.pop(snapshot_id, None)
        self.dropped[snapshot_id] = why
        self.residency.wanted.pop(snapshot_id, None)

    # -- persistence -------------------------------------------------------------------------------
    def state(self) -> dict:
        """What state.json holds: members, payoff, Elo, lineage, counts, the published distributions,
        the residency's counters, dropped snapshots, and the latest pass time and usage measurement."""
        return {"version": STATE_VERSION, "env": self.spec.name, "members": self.members,
                "payoff": self.payoff.to_json(), "payoff_by_seat": self.payoff.seats_to_json(),
                "elo": self.elo.to_json(), "last_snapshot": self.last_snapshot, "lineage": self.lineage,
                "games": self.games, "skipped_results": self.skipped,
                "distributions": self.distributions or {p: self.distribution(p) for p in self.learners},
                "residency": self.residency.to_json(), "dropped": self.dropped, "evicted_games": self.evicted_games,
                "pass_s": round(self.pass_s, 4), "pass_s_max": round(self.pass_s_max, 4),
                "save_s": round(self.save_s, 4), "usage": self.usage.last,
                "time": time.time()}

    def save(self) -> None:
        """Write state.json atomically, then acknowledge the results it holds; every 10 s append the
        ratings to ratings.jsonl (thinned past RATINGS_MAX_BYTES: league/usage.py). A crash loses no
        result: unacknowledged ones are read again on resume. A failed write (a full disk) is logged and
        leaves the previous state.json whole; its results wait for the next save. Writes nothing once
        the launcher that owned the run directory is gone."""
        if not owns_run_dir():
            return
        tmp = self.state_path.with_suffix(".json.tmp")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self.state(), separators=(",", ":")) + "\n")
            os.replace(tmp, self.state_path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            log.error("league state not written to %s (%s); the next pass tries again", self.state_path, e)
            return
        self.results.ack(GROUP, self.unacked)
        self.unacked = []
        if time.time() - self.last_ratings >= 10:
            self.last_ratings = time.time()
            path = self.dir / "ratings.jsonl"
            try:
                with path.open("a") as f:
                    f.write(json.dumps({"time": time.time(), "games": self.games,
                                        "elo": {m: round(r.elo, 1) for m, r in self.elo.ratings.items()}}) + "\n")
                thin_jsonl(path, RATINGS_MAX_BYTES)
            except OSError as e:
                log.error("ratings not written to %s: %s", path, e)

    def adopt_snapshot_files(self) -> list[str]:
        """Make members of the snapshot files the saved state does not name: written by a manager killed
        before its next save. Their info is the one saved in the file's metadata. Returns their ids."""
        adopted = []
        for path in sorted(self.snapshot_dir.glob("*.safetensors")):
            snapshot_id = path.name[:-len(".safetensors")]
            if snapshot_id in self.members or snapshot_id in self.dropped or not SNAPSHOT_ID.fullmatch(snapshot_id):
                continue
            try:
                info = read_meta(path)
                _check_members({snapshot_id: info})
                if info.get("id") != snapshot_id or info["player"] not in self.learners:
                    raise ValueError(f"it names {info.get('id')!r} of player {info.get('player')!r}")
                step = int(info["step"])
            except (CheckpointError, ValueError, KeyError, TypeError) as e:
                log.error("snapshot file %s is not adopted into the league: %s", path, e)
                continue
            self.members[snapshot_id] = info
            self.elo.copy_to(info["player"], snapshot_id)
            if step >= self.last_snapshot[info["player"]]:
                self.last_snapshot[info["player"]] = step
                self.lineage[info["player"]] = snapshot_id
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
            state = json.loads(self.state_path.read_text())
            if state.get("version") != STATE_VERSION or state.get("env") != self.spec.name:
                raise ValueError(f"it is version {state.get('version')} of env {state.get('env')!r}")
            members = {str(k): dict(v) for k, v in state["members"].items()}
            _check_members(members)
            payoff = PayoffTable.from_json(state["payoff"], self.payoff.decay, self.payoff.min_games,
                                           state.get("payoff_by_seat", []))
            elo = EloRatings.from_json(state["elo"], self.elo.k)
            counts = [x for row in state["payoff"] for x in row[2:]] + [
                x for row in state.get("payoff_by_seat", []) for x in row[3:]]
            numbers = counts + [x for v in state["elo"].values() for x in v]
            if not all(math.isfinite(x) for x in numbers) or any(x < 0 for x in counts):
                raise ValueError("its payoff or ratings hold negative or non-finite numbers")
            last = {p: int(state.get("last_snapshot", {}).get(p, 0)) for p in self.learners}
            lineage = {p: state.get("lineage", {}).get(p) for p in self.learners}
            games, evicted_games = int(state.get("games", 0)), int(state.get("evicted_games", 0))
            dropped = {str(k): str(v) for k, v in dict(state.get("dropped", {})).items()}
            residency = dict(state.get("residency", {}))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"--resume: league state {self.state_path} is not usable: {e}") from None
        # Learners and bots come from the config: a bot removed from league.bots leaves the league.
        gone = [m for m, info in members.items() if info["kind"] == "bot" and m not in self.cfg.league.bots]
        self.members.update({m: info for m, info in members.items() if info["kind"] == "snapshot"})
        self.payoff, self.elo = payoff, elo
        for member in gone:
            self.payoff.remove(member)
            self.elo.ratings.pop(member, None)
        self.last_snapshot, self.lineage, self.games, self.evicted_games = last, lineage, games, evicted_games
        self.dropped = dropped
        self.adopt_snapshot_files()
        for snapshot_id in self.snapshots():
            if not self.residency.path(snapshot_id).is_file():
                self.drop(snapshot_id, f"checkpoint not found: {self.residency.path(snapshot_id)}")
        self.residency.restore(residency, set(self.snapshots()))
        log.info("league resumed from %s: %d snapshots, %d games", self.state_path, len(self.snapshots()), self.games)

    # -- loop --------------------------------------------------------------------------------------
    def one_pass(self) -> None:
        """Steps 1-5 of the module docstring. `pass_s` times steps 1-4 (results, payoff, Elo, snapshots,
        PFSP, distributions, residency), `save_s` step 5's state and ratings (when it saved)."""
        start = time.perf_counter()
        self.consume_results()
        self.snapshot_due_learners()
        self.publish()
        self.rebalance_snapshots()
        self.pass_s = time.perf_counter() - start
        self.pass_s_max = max(self.pass_s_max, self.pass_s)
        if time.monotonic() >= self.next_save:
            start = time.perf_counter()
            self.save()
            self.save_s = time.perf_counter() - start
            self.next_save = time.monotonic() + self.save_s / SAVE_DUTY
        if self.usage.due(time.monotonic()):
            self.usage.check(self.redis, time.monotonic(), time.time())

    def run(self) -> None:
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
                 ", ".join(self.learners), ", ".join(self.cfg.league.bots) or "none", self.residency.capacity)
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
        log.info("league: %d snapshots, %d games scored; top: %s", len(self.snapshots()), self.games,
                 ", ".join(f"{m} {r.elo:.0f}±{r.uncertainty:.0f}" for m, r in
                           sorted(self.elo.ratings.items(), key=lambda kv: -kv[1].elo)[:5]))


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
