"""The league manager process: payoff and ratings from episode results, snapshots, opponent distributions.

One pass every `league.manager_every_s` seconds:
  1. read new episode results (consumer group `league` on `{run}:results`) into the payoff table and
     the Elo ratings (only games one opponent version played throughout, see `single_opponent`);
  2. freeze snapshots of learners that are due (see `due_snapshot`), reset exploiters that earned it;
  3. publish each learner's opponent distribution (league/matchmaking.py) for its actors;
  4. write the league state (`<run dir>/league/state.json`, atomically) and a ratings history line.

Snapshots are checkpoint files (`league/snapshots/<id>.safetensors`, loadable by `load_policy`) and
weights in Redis for the actors. `--resume` reloads the state and puts the snapshots back into Redis.
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

from impala_league.agents.checkpoint import CheckpointError, model_state, read_checkpoint, save_checkpoint
from impala_league.agents.model import make_model
from impala_league.config import Config, ConfigError, to_yaml, without_secrets
from impala_league.distributed import keys
from impala_league.distributed.codec import WeightsCorrupt, decode_weights, encode_weights
from impala_league.distributed.ownership import owns_run_dir, run_role
from impala_league.distributed.params import ParamStore
from impala_league.distributed.transport import LearnerLease, ResultsStream, connect, run_is_over
from impala_league.envs.registry import env_spec
from impala_league.league.matchmaking import SELF, league_exploiter_opponents, main_agent_opponents, main_exploiter_opponents
from impala_league.league.payoff import EloRatings, PayoffTable, episode_score
from impala_league.league.players import MAIN, PLAYER_ID, learner_players, namespace, role
from impala_league.league.store import LeagueStore

log = logging.getLogger("league")

GROUP = "league"
STATE_VERSION = 1
SNAPSHOT_ID = re.compile(r"(main|(main_exploiter|league_exploiter)_\d+)-\d{7,}")  # also a safe file name


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
        save_checkpoint(self.snapshot_dir / f"{snapshot_id}.safetensors", model, None,
                        to_yaml(without_secrets(self.cfg)), info)
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
        out = {p: self.distribution(p) for p in self.learners}
        for player, dist in out.items():
            self.store.publish_opponents(player, dist)
        return out

    # -- persistence -------------------------------------------------------------------------------
    def state(self) -> dict:
        return {"version": STATE_VERSION, "env": self.spec.name, "members": self.members,
                "payoff": self.payoff.to_json(), "payoff_by_seat": self.payoff.seats_to_json(), "elo": self.elo.to_json(), "last_snapshot": self.last_snapshot,
                "lineage": self.lineage, "games": self.games, "skipped_results": self.skipped,
                "distributions": {p: self.distribution(p) for p in self.learners}, "time": time.time()}

    def save(self) -> None:
        """Write state.json atomically, then acknowledge the results it holds; every 10 s append the
        ratings to ratings.jsonl. A crash loses no result: unacknowledged ones are read again on resume.
        Writes nothing once the launcher that owned the run directory is gone."""
        if not owns_run_dir():
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.state(), indent=1) + "\n")
        os.replace(tmp, self.state_path)
        self.results.ack(GROUP, self.unacked)
        self.unacked = []
        if time.time() - self.last_ratings >= 10:
            self.last_ratings = time.time()
            with (self.dir / "ratings.jsonl").open("a") as f:
                f.write(json.dumps({"time": time.time(), "games": self.games,
                                    "elo": {m: round(r.elo, 1) for m, r in self.elo.ratings.items()}}) + "\n")

    def restore_snapshots(self, only_missing: bool = True) -> None:
        """Put snapshot weights back into Redis from their files (all, or those Redis lost).

        A snapshot whose file is missing or corrupt is dropped from the league with an error naming it.
        """
        ids = self.snapshots()
        if only_missing:
            pipe = self.redis.pipeline(transaction=False)
            for snapshot_id in ids:
                pipe.exists(self.store.snapshot_key(snapshot_id))
            ids = [i for i, present in zip(ids, pipe.execute()) if not present]
            if ids:
                log.warning("Redis lost the weights of %d snapshots; putting them back from their files", len(ids))
        for snapshot_id in ids:
            path = self.snapshot_dir / f"{snapshot_id}.safetensors"
            try:
                tensors, _ = read_checkpoint(path)
                self.store.put_snapshot(snapshot_id, encode_weights(model_state(tensors)))
            except CheckpointError as e:
                log.error("dropping snapshot %s from the league: %s", snapshot_id, e)
                del self.members[snapshot_id]

    def load(self) -> None:
        """Restore state.json and put every snapshot's weights back into Redis.

        A snapshot whose file is missing or corrupt is dropped from the league with an error naming it.
        Raises CheckpointError when state.json itself is unreadable or of another env.
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
            games = int(state.get("games", 0))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"--resume: league state {self.state_path} is not usable: {e}") from None
        # Learners and bots come from the config: a bot removed from league.bots leaves the league.
        gone = [m for m, info in members.items() if info["kind"] == "bot" and m not in self.cfg.league.bots]
        self.members.update({m: info for m, info in members.items() if info["kind"] == "snapshot"})
        self.payoff, self.elo = payoff, elo
        for member in gone:
            self.payoff.remove(member)
            self.elo.ratings.pop(member, None)
        self.restore_snapshots(only_missing=False)
        self.last_snapshot, self.lineage, self.games = last, lineage, games
        log.info("league resumed from %s: %d snapshots, %d games", self.state_path, len(self.snapshots()), self.games)

    # -- loop --------------------------------------------------------------------------------------
    def run(self) -> None:
        done_key = keys.done(self.cfg.run.name)
        self.lease = LearnerLease(self.redis, self.cfg.run.name, f"{socket.gethostname()} pid {os.getpid()}",
                                  role="league", ttl_s=self.cfg.run.lease_ttl_s)
        if not self.lease.acquire(should_stop=lambda: self.stopping):
            return
        self.consume_results(pending=True)
        self.publish()
        self.save()
        log.info("league manager (pid %d): learners %s, bots %s", os.getpid(), ", ".join(self.learners),
                 ", ".join(self.cfg.league.bots) or "none")
        while not self.stopping:
            self.consume_results()
            self.restore_snapshots()
            self.snapshot_due_learners()
            self.publish()
            self.save()
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
