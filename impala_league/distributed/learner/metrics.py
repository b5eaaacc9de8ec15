"""What a learner writes about its training: one record per `run.log_every_s` to metrics.jsonl and the
trackers (wandb, TensorBoard), and a log line; at the end of the run, the report's figures.

`MetricsWindow` gathers what the updates of one record's window trained on and measured; `LearnerMetrics`
adds the learner's progress, the stream's delivery counts, the episodes the actors reported and the
fault counters, and writes the record.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import redis

from impala_league.config import Config
from impala_league.distributed.learner.replay import ReplayBuffer
from impala_league.distributed.wire.params import ParamStore
from impala_league.distributed.wire.shards import ShardedTrajectories
from impala_league.distributed.wire.transport import ResultsStream, redis_outages
from impala_league.envs.registry import EnvSpec
from impala_league.league.matchmaking import SELF
from impala_league.league.payoff import episode_score
from impala_league.league.players import MAIN, metrics_path
from impala_league.tracking import Tracker, start_tracking, strict_json

log = logging.getLogger("learner")

LAG_BINS = 64  # policy_lag_counts: unrolls per lag 0..62, and 63 or more


# A healthy torso has dead units too (IMPALA's shallow torso after learning Pong: about 60% of its 256 FC units
# are 0 on every step of a batch of 84); 99% was the Boxing league whose policy stayed uniform for 15M frames.
DEAD_UNITS_WARNING = 0.9


@dataclass
class MetricsWindow:
    """What the updates since `start` (monotonic seconds) trained on and measured."""

    start: float
    agent_steps: int = 0
    lags: list = field(default_factory=list)  # policy lag of each fresh unroll
    stats: list = field(default_factory=list)
    replay_lags: list = field(default_factory=list)  # policy lag of each replayed unroll, when it was trained on
    update_s: float = 0.0  # seconds in the updates themselves (`train_on`)
    waited_s: float = 0.0  # seconds the update's thread waited for its next batch

    def add(self, agent_steps: int, lags: list[int], stats: dict[str, float], replay_lags: list[int] = ()) -> None:
        self.agent_steps += agent_steps
        self.lags += lags
        self.stats.append(stats)
        self.replay_lags += replay_lags

    def replay_summary(self) -> dict[str, float]:
        """Experience replay: `replayed_fraction`, the share of the unrolls trained on that were
        replayed, and `replay_policy_lag`, their mean policy lag (learner step - policy_version) when
        trained on, left out of a window that replayed none."""
        trained = len(self.lags) + len(self.replay_lags)
        record = {"replayed_fraction": len(self.replay_lags) / max(trained, 1)}
        if self.replay_lags:
            record["replay_policy_lag"] = float(np.mean(self.replay_lags))
        return record

    def summary(self, now: float) -> dict[str, float]:
        """Mean of each learn_step statistic, SPS (agent steps trained per second), policy lag
        (mean, max, and `policy_lag_counts`: unrolls per lag 0, 1, ..., the last bin LAG_BINS-1 or more), and
        the shares of the window's wall-clock time the update's thread spent in updates (`update_share`) and
        waiting for a batch (`wait_share`): a learner that waits is starved, one that updates is the bottleneck.
        A negative lag (the unroll's version ahead of the learner: acted by weights from before the learner
        resumed from an older checkpoint) is counted in `policy_lag_negative` and left out of the lag
        statistics, which are null when the window has no other unroll."""
        record = {k: float(np.mean([s[k] for s in self.stats])) for k in self.stats[0] if k != "skipped_update"}
        record["skipped_updates"] = int(sum(s["skipped_update"] for s in self.stats))
        lags = [lag for lag in self.lags if lag >= 0]
        record.update({"sps": self.agent_steps / max(now - self.start, 1e-9),
                       "policy_lag": float(np.mean(lags)) if lags else math.nan,
                       "policy_lag_max": int(max(lags)) if lags else None,
                       "policy_lag_counts": np.bincount(np.clip(lags, 0, LAG_BINS - 1)).tolist() if lags else [],
                       "policy_lag_negative": len(self.lags) - len(lags)})
        seconds = max(now - self.start, 1e-9)
        record.update(update_share=self.update_s / seconds, wait_share=self.waited_s / seconds)
        return record


class LearnerMetrics:
    """A learner's metrics records: metrics.jsonl (`file`; rank 0's alone, the other ranks' records would
    repeat its counts, so theirs go to os.devnull), the trackers (`tracker`, wandb / TensorBoard, started by
    `start_tracking`) and one log line per record.

    `window` (MetricsWindow) gathers the updates since the last record; `log` adds to them the
    learner's progress it is handed, the stream's delivery counts, the episodes reported on the results
    stream since (`results`, this player's), Redis's and the weights' fault counters, the replay's size and,
    with several trajectory shards, each shard's queue; then starts the next window. `started_at`: the
    wall-clock time (s since the epoch) this process's training started. `report(run_dir, tracker)`, if
    set, logs the report's figures at the end (run.py passes analysis.report.log_report: roles import no
    report code).
    """

    def __init__(self, cfg: Config, run_dir: Path, player: str, spec: EnvSpec, is_main: bool, client: redis.Redis,
                 params: ParamStore, trajectories: ShardedTrajectories, unrolls_per_entry: int,
                 replay: ReplayBuffer | None, device: str | None = None):
        """`trajectories` and `unrolls_per_entry` (what the actors put in one stream entry): the stream
        whose queue a record reports, in unrolls; `replay`: the learner's, or None; `device`: the one it
        trains on ('cuda:0', 'cpu'), each record's `learner_device` (learner.device may say only 'auto')."""
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.player = player
        self.spec = spec
        self.redis = client
        self.params = params
        self.trajectories = trajectories
        self.unrolls_per_entry = unrolls_per_entry
        self.replay = replay
        self.device = device
        self.results = ResultsStream(client, cfg.run.name)
        self.file = (metrics_path(self.run_dir, player) if is_main else Path(os.devnull)).open("a")
        self.tracker = Tracker([])  # wandb / TensorBoard: `start_tracking`
        self.report: Callable[[Path, Tracker], None] | None = None
        self.started_at = time.time()
        self.window = MetricsWindow(time.monotonic())
        self.warned_dead_units = False

    @property
    def tracking_name(self) -> str:
        """This learner's wandb id and TensorBoard folder: the run name, with the player for exploiters."""
        return self.cfg.run.name if self.player == MAIN else f"{self.cfg.run.name}-{self.player}"

    def start_tracking(self, step: int) -> None:
        """Start the trackers the config selects, at learner update `step` (> 0 after a resume)."""
        self.tracker = start_tracking(self.cfg, self.run_dir, self.tracking_name, step)

    def start(self, now: float) -> None:
        """Training starts at `now` (monotonic seconds): the first window begins."""
        self.started_at = time.time()
        self.window = MetricsWindow(now)

    def log(self, now: float, *, step: int, agent_steps: int, elapsed_s: float, learning_rate: float,
            counts: dict[str, float], rolled_back: int) -> None:
        """Write the record of the window ending `now` and start the next window. step, agent_steps (agent
        steps trained), elapsed_s (the run's training seconds), learning_rate: the learner's; counts: the
        stream's `accounting()`, with the counts of earlier Redis servers added; rolled_back: unrolls acked
        after the checkpoint this learner resumed from, whose updates it lacks."""
        episodes = [e for e in self.results.read_new() if e.get("player", MAIN) == self.player]
        nonfinite = sum(bool(e.get("nonfinite")) for e in episodes)  # counted, and left out of every statistic
        episodes = [e for e in episodes if not e.get("nonfinite")]
        record = self.window.summary(now)
        record.update({
            # Agent steps trained (`frames` in records written before; the unit of run.total_agent_steps and SPS) and
            # env steps played by the actors (each env.step once, whoever acted).
            "step": step, "agent_steps_trained": agent_steps,
            "env_steps_played": counts["env_steps"], "time": time.time(),
            "elapsed_s": elapsed_s, "learner_started": self.started_at,
            # Entries hold actor.send_batch unrolls: the queue in unrolls, as actor.high_water_mark counts.
            "queue_depth": counts["backlog"] * self.unrolls_per_entry, "dead_letters": counts["dead_lettered"],
            "unrolls_produced": counts["produced"], "unrolls_trained": counts["trained"],
            "unrolls_rolled_back": rolled_back,
            "episodes": len(episodes), "nonfinite_episodes": nonfinite, "learning_rate": learning_rate,
            "stream_losses": self.trajectories.group_losses, "redis_outages": redis_outages(self.redis),
            "corrupt_weight_loads": self.params.corrupt_count(),
            "weight_replica_fallbacks": self.params.replica_fallback_count(),
            "actors_throttled_s": counts["throttled_s"],
        })
        if self.device:  # a string: the trackers log only the numbers
            record["learner_device"] = self.device
        if self.spec.frames_per_step != 1:  # Atari: the published curves count emulator frames
            record["emulator_frames"] = counts["env_steps"] * self.spec.frames_per_step
        if self.replay is not None:
            record.update(self.window.replay_summary(), replay_unrolls=len(self.replay),
                          replay_mb=self.replay.nbytes / 2**20)
        if getattr(self.trajectories, "shards", 1) > 1:  # (A3C's gradient stream is one TrajectoryStream)
            record["queue_depth_shards"] = [n * self.unrolls_per_entry for n in self.trajectories.backlogs]
            record["shard_servers_down"] = self.trajectories.servers_down()
        record.update(episode_statistics(episodes, len(self.spec.seats)))
        self.file.write(strict_json(record) + "\n")
        self.file.flush()
        self.tracker.log(record, step)
        self.log_line(record)
        self.warn_dead_units(record)
        self.window = MetricsWindow(now)

    def warn_dead_units(self, record: dict) -> None:
        """Once a run: most of the torso's units are dead (agents.core.dead_units above DEAD_UNITS_WARNING
        on the window's mean): the network has stopped telling states apart, which no gradient step undoes."""
        if self.warned_dead_units or record.get("dead_units", 0.0) <= DEAD_UNITS_WARNING:
            return
        self.warned_dead_units = True
        log.warning("%.0f%% of the torso's output units were 0 on every step of each batch (dead ReLUs, "
                    "metrics.jsonl's dead_units): the policy hardly depends on the state any more and these units "
                    "get no gradient; a smaller learner.learning_rate or a larger learner.adam_eps keeps them "
                    "alive longer, learner.redo_every recycles them (ReDo); configs/atari_boxing_league.yaml "
                    "says how it died there", 100 * record["dead_units"])

    def log_line(self, record: dict) -> None:
        """The record's numbers a person follows, as one log line."""
        games = []
        if "episode_return" in record and self.spec.kind != "aec":
            games.append(f"return {record['episode_return']:.1f}")
        if "first_seat_win_rate" in record:
            games.append(f"first-seat wins {record['first_seat_win_rate']:.2f}")
        if "league_score" in record:
            seats = [f"{record[k]:.2f}" if k in record else "-"
                     for k in map(seat_score_key, range(len(self.spec.seats)))]
            games.append(f"league score {record['league_score']:.2f}"
                         + (f" (per seat {' / '.join(seats)})" if len(seats) > 1 else ""))
        if "episode_length" in record:
            games.append(f"len {record['episode_length']:.1f}")
        if "emulator_frames" in record:
            games.append(f"emulator frames {record['emulator_frames']:,}")
        lag = "-" if record["policy_lag"] is None else f"{record['policy_lag']:.1f}"
        log.info("%sagent steps trained %s/%s  env steps played %s  SPS %s  lag %s  queue %d  loss %.3f  "
                 "entropy %.2f  rho %.2f  %s", "" if self.player == MAIN else f"[{self.player}] ",
                 f"{record['agent_steps_trained']:,}", f"{self.cfg.run.total_agent_steps:,}", f"{record['env_steps_played']:,}",
                 f"{record['sps']:,.0f}", lag, record["queue_depth"],
                 record["loss"], record["entropy"], record["mean_rho"], "  ".join(games))

    def close(self, report: bool = False) -> None:
        """Close metrics.jsonl and the trackers; `report`: log the report's figures to them first (the
        main agent's run that reached its end; a plotting error is logged and does not fail the run)."""
        self.file.close()
        if not self.tracker:
            return
        if report and self.report is not None:
            try:
                self.report(self.run_dir, self.tracker)
            except (ValueError, OSError, KeyError, TypeError) as e:
                log.warning("could not log the report figures: %s: %s", type(e).__name__, e)
        self.tracker.finish()


def episode_statistics(episodes: list[dict], num_seats: int) -> dict[str, float]:
    """Of the finite episodes the actors reported: mean length and learner's return; in self-play
    between two or more seats, the first seat's win rate and the draw rate; in league games, the
    learner's mean score (`league_score`) and its score per seat (`seat_scores`). None of them without
    such episodes."""
    self_play = [e for e in episodes if e.get("opponent_id", SELF) == SELF]
    league = [e for e in episodes if e.get("opponent_id", SELF) != SELF]
    record = {}
    if episodes:
        record["episode_length"] = float(np.mean([e.get("length", 0) for e in episodes]))
        record["episode_return"] = float(np.mean([_learner_return(e) for e in episodes]))
    if self_play and num_seats > 1:
        winners = np.array([e.get("winner", -1) for e in self_play])
        record["first_seat_win_rate"] = float(np.mean(winners == 0))
        record["draw_rate"] = float(np.mean(winners == -1))
    if league:
        record["league_score"] = float(np.mean([episode_score(e) for e in league]))
        record.update(seat_scores(league, num_seats))
    return record


def seat_score_key(seat: int) -> str:
    """The metrics key of the learner's league score when it held seat `seat` (0 moves first)."""
    return f"league_score_seat_{seat}"


def seat_scores(episodes: list[dict], num_seats: int) -> dict[str, float]:
    """The learner's mean score (1 win, 0.5 draw, 0 loss) per seat it held, over league games: in a
    game with a first-move advantage the pooled `league_score` hides a weak seat (0.553 as first
    player and 0.282 as second pooled to 0.49 in one tic-tac-toe league). Seats without games are
    left out. Only games of two or more seats have per-seat scores."""
    if num_seats < 2:
        return {}
    out = {}
    for seat in range(num_seats):
        scores = [episode_score(e) for e in episodes if e.get("learner_seat", -1) == seat]
        if scores:
            out[seat_score_key(seat)] = float(np.mean(scores))
    return out


def _learner_return(episode: dict) -> float:
    """The learner's return in a reported episode: its seat's, or the mean over seats in self-play."""
    returns = episode.get("returns") or [0.0]
    seat = episode.get("learner_seat", -1)
    return float(returns[seat]) if 0 <= seat < len(returns) else float(np.mean(returns))
