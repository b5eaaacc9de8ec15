"""Learner process: batches of unrolls from Redis -> V-trace actor-critic update -> published weights.

`Learner.run` is the loop, one readable step per line: next batch, train on it, acknowledge it, record
it, and a checkpoint when one is due. Its parts have files of their own: the update, the algorithm
(IMPALA, Espeholt et al. 2018, sec. 4: distributed/learner/update.py `learn_step`); the reads (`Ingest`,
distributed/learner/ingest.py); the checkpoint and the training clock (distributed/learner/checkpoints.py,
distributed/learner/clock.py); the metrics (distributed/learner/metrics.py); several learners as one
(distributed/learner/data_parallel.py); the board's mirror (distributed/learner/augmentation.py); the batch record
(impala_league/batch.py).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from functools import partial
from pathlib import Path
from typing import Callable

import redis
import torch

from impala_league.agents.core import flatten_steps
from impala_league.agents.model import make_model, policy_head
from impala_league.agents.redo import recycle_dormant_units
from impala_league.batch import Batch
from impala_league.config import Config, ConfigError, core_size, replayed_per_batch
from impala_league.distributed.launch.allocator import keep_freed_memory
from impala_league.distributed.launch.ownership import run_role
from impala_league.distributed.learner.augmentation import Mirror
from impala_league.distributed.learner.checkpoints import Checkpoints
from impala_league.distributed.learner.clock import TrainingClock
from impala_league.distributed.learner.data_parallel import (DataParallelError, Group, average_gradients,
                                                             average_tensor, broadcast_state, cuda_device_for, join)
from impala_league.distributed.learner.ingest import Ingest, Prepared
from impala_league.distributed.learner.ingest_workers import IngestWorkerError, worker_settings
from impala_league.distributed.learner.metrics import LearnerMetrics
from impala_league.distributed.learner.replay import make_replay
from impala_league.distributed.learner.update import (learn_step, make_optimizer, pick_device, scheduled_learning_rate,
                                                     slow_bf16_warning)
from impala_league.distributed.wire import keys
from impala_league.distributed.wire.codec import UnrollSpec
from impala_league.distributed.wire.params import ParamStore
from impala_league.distributed.wire.shards import ShardedTrajectories
from impala_league.distributed.wire.transport import LearnerLease, connect, run_is_over
from impala_league.envs.registry import env_spec
from impala_league.league.players import MAIN, namespace
from impala_league.league.store import LeagueStore
from impala_league.tracking import Tracker

log = logging.getLogger("learner")


class Learner:
    """One learner process: the model and its optimizer, and `run`, the loop that trains them until the
    run is done: next batch -> train on it -> acknowledge it -> record it, and a checkpoint when one is due.

    step: updates made; agent_steps: agent steps trained (K x F x T an update with K learners of F fresh unrolls
    of T steps). The loop's helpers: `ingest` (the reads: `Ingest`), `checkpoints` (the checkpoint and the
    run's state it carries: distributed/learner/checkpoints.py; among it `clock`, the training seconds and trained
    count: distributed/learner/clock.py), `metrics` (metrics.jsonl and the trackers:
    distributed/learner/metrics.py), `group` (the ranks of several learners: distributed/learner/data_parallel.py),
    `params` (the published weights), `lease` (one learner per run), `mirror` (board augmentation).
    A subclass reads other entries through its own `make_ingest` and trains on them through its own
    `train_on` (A3C's parameter server, distributed/a3c.py).
    """

    role = "learner"  # in log lines (A3C's parameter server is named as such)

    def __init__(self, cfg: Config, redis_url: str, run_dir: Path, resume: bool = False, player: str = MAIN,
                 rank: int = 0, dist_url: str | None = None):
        """`rank` and `dist_url` (tcp://host:port): this process's place among `learner.num_learners`
        learners of the main agent (distributed/learner/data_parallel.py); unused with one learner. Joining the
        process group blocks until every rank has joined. Raises ConfigError, CheckpointError,
        DataParallelError."""
        self.cfg = cfg
        self.player = player
        self.spec = env_spec(cfg.env.name, cfg.env.kwargs, cfg.env.seats)
        self.device = pick_device(cfg.learner.device)
        # Several learners (data parallel): rank 0 is the learner of one; the others only train.
        if cfg.learner.num_learners > 1 and dist_url is None:
            raise ConfigError(f"learner.num_learners={cfg.learner.num_learners}: each learner needs its --rank and "
                              "the rendezvous --dist-url tcp://<rank 0 host>:<port> (run.py train passes both)")
        self.device = cuda_device_for(rank, self.device)
        self.group = join(rank, cfg.learner.num_learners, dist_url, self.device) if dist_url else Group.single()
        torch.manual_seed(cfg.run.seed)
        self.model = make_model(self.spec, cfg.agent).to(self.device)
        self.head = policy_head(self.spec)
        self.optimizer = make_optimizer(self.model, cfg.learner)
        self.step = self.agent_steps = 0
        self.checkpoints = Checkpoints(cfg, run_dir, player, self.spec.name, self.group.is_main, self.label)
        if resume and not self.group.is_main:
            pass  # rank 0's state reaches this rank in sync_start
        elif resume and self.checkpoints.path.exists():
            self.step, self.agent_steps = self.checkpoints.restore(self.model, self.optimizer)
        elif resume:
            log.warning("--resume: no checkpoint at %s; starting from scratch", self.checkpoints.path)
        else:
            self.checkpoints.check_fresh_start()
        self.redis = connect(redis_url, block_ms=cfg.learner.read_block_ms, retry_s=cfg.run.redis_retry_s)
        prefix = namespace(cfg.run.name, player)  # of this learner's own keys
        self.params = ParamStore(self.redis, prefix, delay=cfg.actor.weight_delay)
        # The run's lease: one learner (rank 0 of several) trains it; taken in `start`.
        self.lease = LearnerLease(self.redis, prefix, f"{socket.gethostname()} pid {os.getpid()}",
                                  ttl_s=cfg.run.lease_ttl_s)
        if self.checkpoints.league_resets is None:  # else one asked for while it was down is applied at once
            self.checkpoints.league_resets = self.league_resets()
        self.stopping = False
        self.stop_signal: int | None = None  # the signal that asked it to stop (SIGTERM, SIGINT), if one did
        self.mirror = Mirror(self.spec, cfg.learner.mirror_augment, self.device, seed=cfg.run.seed * 1009 + rank)
        consumer = f"learner-{socket.gethostname()}" + (f"-rank{rank}" if rank else "")
        self.ingest = self.make_ingest(redis_url, prefix, consumer, rank)
        self.metrics = LearnerMetrics(cfg, run_dir, player, self.spec, self.group.is_main, self.redis, self.params,
                                      self.ingest.trajectories, self.ingest.unrolls_per_entry, self.ingest.replay,
                                      device=str(self.device))

    @property
    def label(self) -> str:
        """This learner in log lines: its role, its player unless it is the main agent, its rank among several."""
        label = self.role if self.player == MAIN else f"{self.role} {self.player}"
        return label + (f" rank {self.group.rank}" if self.group.distributed else "")

    @property
    def clock(self) -> TrainingClock:
        """The run's training seconds and trained count, which the checkpoint carries (distributed/learner/clock.py)."""
        return self.checkpoints.clock

    def checkpoint(self) -> None:
        """Save model, optimizer, step, agent steps and the run's carried state (`Checkpoints.save`: rank 0
        alone, while the run directory is ours)."""
        self.checkpoints.save(self.model, self.optimizer, self.step, self.agent_steps)

    def stop(self, signum: int | None = None, _frame: object = None) -> None:
        """Stop before the next update; a signal handler (`signum`: the signal, kept for the exit code)."""
        self.stopping = True
        self.stop_signal = self.stop_signal or signum

    def league_resets(self) -> int:
        """How many times the league manager has asked to reset this learner's weights (league/store.py)."""
        return LeagueStore(self.redis, self.cfg.run.name).reset_count(self.player)

    def follow_league(self) -> None:
        """Re-initialise weights and optimizer when the league manager resets this exploiter (AlphaStar
        resets exploiters so that they keep finding new weaknesses rather than polishing one)."""
        count = self.league_resets()
        if count == self.checkpoints.league_resets:
            return
        self.checkpoints.league_resets = count
        torch.manual_seed(self.cfg.run.seed + 7919 * count)
        self.model = make_model(self.spec, self.cfg.agent).to(self.device)
        self.optimizer = make_optimizer(self.model, self.cfg.learner)
        if self.ingest.replay is not None:  # the new weights learn from their own games, not the old ones'
            self.ingest.replay.clear()
        self.params.publish(self.model.state_dict(), self.step, self.agent_steps)
        log.info("%s: weights reset by the league (reset %d) at update %d", self.label, count, self.step)

    # -- reading -----------------------------------------------------------------------------------
    def make_ingest(self, redis_url: str, namespace: str, consumer: str, rank: int) -> Ingest:
        """This learner's reads (`namespace`: the prefix of its keys; `consumer`: its name in the stream's
        group; `rank`: its place among several learners, which seeds its replay): unrolls from every trajectory
        shard (transport.shards), with its replay when learner.replay_fraction > 0 and its ingest workers
        when learner.ingest_workers > 0."""
        cfg = self.cfg
        unroll_spec = UnrollSpec(self.spec, cfg.actor.unroll_length, core_size(cfg.agent))
        replayed = replayed_per_batch(cfg.learner)
        fresh = cfg.learner.batch_size - replayed  # F: unrolls per update from the stream
        settings = None if not cfg.learner.ingest_workers else worker_settings(
            redis_url=redis_url, namespace=namespace, env=cfg.env.name, env_kwargs=dict(cfg.env.kwargs),
            env_seats=cfg.env.seats and [list(seat) for seat in cfg.env.seats],
            unroll_length=cfg.actor.unroll_length, core_size=core_size(cfg.agent), shards=cfg.transport.shards,
            shard_urls=list(cfg.transport.shard_urls), block_ms=cfg.learner.read_block_ms,
            retry_s=cfg.run.redis_retry_s, unrolls_per_entry=cfg.actor.send_batch, fresh=fresh,
            done_key=None if self.player == MAIN else keys.done(cfg.run.name))
        return Ingest(
            cfg, ShardedTrajectories(self.redis, redis_url, namespace, cfg.transport.shards,
                                     cfg.transport.shard_urls, cfg.learner.read_block_ms),
            consumer, fresh=fresh, unrolls_per_entry=cfg.actor.send_batch, unrolls_left=self.unrolls_left,
            stopping=lambda: self.stopping, run_over=self.run_is_over, unroll_spec=unroll_spec,
            replay=make_replay(cfg, unroll_spec, replayed, rank, self.player) if replayed else None,
            pin=self.device.type == "cuda", worker_settings=settings)

    def unrolls_left(self) -> float:
        """Unrolls the run may still read before run.total_agent_steps (every rank reads as many: agent steps count
        every rank's unrolls)."""
        return (self.cfg.run.total_agent_steps - self.agent_steps) / (self.cfg.actor.unroll_length * self.group.size)

    def run_is_over(self) -> bool:
        """An exploiter's reads end with the main agent's run (its actors are gone then)."""
        return self.player != MAIN and bool(self.redis.exists(keys.done(self.cfg.run.name)))

    def acknowledge(self, ids: list[bytes], headers: list[dict]) -> None:
        """Ack a batch the update has trained on, counting its unrolls as trained (`Ingest.acknowledge`)."""
        trained = self.ingest.acknowledge(ids, headers)
        if trained is not None:  # (ingest workers ack for the learner: `checkpoint_trained` reads their count)
            self.clock.unrolls_trained = trained

    # -- main loop ---------------------------------------------------------------------------------
    def run(self) -> None:
        """Train until `run.total_agent_steps` (or `run.max_minutes`, or a stop signal), then checkpoint: take
        the next batch, train on it, acknowledge it, record it; checkpoint when one is due.

        Several learners (`learner.num_learners`) run this loop in step: they agree before every update
        whether to go on (`next_batch`), so they stop at the same update, and all-reduce the gradients in it.
        Raises DataParallelError when a peer rank is gone."""
        if not self.start():
            return
        try:
            while (got := self.next_batch()) is not None:
                (ids, headers, prepared), lr = got
                if self.checkpoints.due(time.monotonic()):
                    self.checkpoint_trained()  # here: once the ranks agreed to go on, each has acked its last batch
                agent_steps = self.agent_steps
                stats = self.train(prepared, lr)
                # Replay first: a worker's batch lives in its shared-memory slot until the ack gives it back.
                replay_lags = self.ingest.remember(prepared, headers, stats, self.step)
                self.acknowledge(ids, headers)
                self.record(self.agent_steps - agent_steps, headers, stats, replay_lags)
                if self.player != MAIN and self.step % 10 == 0:
                    self.follow_league()
        finally:
            self.ingest.close()  # what it read ahead stays pending
        # The last, partial window: a run shorter than run.log_every_s still gets a record.
        if self.metrics.window.stats and self.group.is_main:
            self.log_metrics(time.monotonic())
        self.finish()

    def start(self) -> bool:
        """Take the run's lease (rank 0), give every rank rank 0's state, ready the stream (its group, the
        entries a stopped learner left pending, the unrolls acked after the checkpoint), publish the first
        weights, start the trackers, the clocks and the reads ahead. False when told to stop while waiting
        for the lease (nothing is trained then). Raises LeaseHeld when another live learner keeps it."""
        cfg, main = self.cfg, self.group.is_main
        acquired = self.lease.acquire(should_stop=lambda: self.stopping) if main else True
        (refused,), _ = self.group.agree((not acquired,), 0.0, self.device)
        if refused:
            self.metrics.close()
            return False
        self.sync_start()
        # A `done` left by an earlier end of this run (now resumed with more agent steps) would send every
        # actor home at once and starve this learner. The launcher clears it too; standalone learners need this.
        if self.player == MAIN and main:
            self.redis.delete(keys.done(cfg.run.name))
        self.ingest.trajectories.ensure_group()
        if main:
            self.checkpoints.count_rolled_back(self.ingest.trajectories.accounting()["trained"])
        self.ingest.claim_stale()
        if main:
            self.metrics.results.skip_to_end()
            self.params.publish(self.model.state_dict(), self.step, self.agent_steps)
            self.metrics.start_tracking(self.step)
        if warning := slow_bf16_warning(cfg.learner.precision, self.device):
            log.warning("%s", warning)
        log.info("%s on %s, %s, %d params; training to %s agent steps%s", self.label, self.device, self.spec.name,
                 sum(p.numel() for p in self.model.parameters()), f"{cfg.run.total_agent_steps:,}",
                 f" or {cfg.run.max_minutes:g} minutes, whichever comes first" if cfg.run.max_minutes else "")
        started = time.monotonic()
        self.checkpoints.start(started)  # the clock, and the time to the first checkpoint
        self.metrics.start(started)
        self.ingest.start()
        return True

    def next_batch(self) -> tuple[tuple[list, list[dict], object], float] | None:
        """The next batch (ids, headers, prepared) and the learning rate to train on it with; None to stop.
        Every rank stops when one has no batch (`reached_end`, or an exploiter's run is over) or was told
        to stop, and trains at rank 0's learning rate (`Group.agree`; nothing to agree with one learner).
        The wait for the batch is counted in the metrics window."""
        waited = time.monotonic()
        got = None if self.reached_end() else self.ingest.get()
        self.metrics.window.waited_s += time.monotonic() - waited
        # Rank 0's learning rate for all: `linear` counts rank 0's clock (run.max_minutes).
        lr = scheduled_learning_rate(self.cfg, self.agent_steps, self.clock.elapsed())
        (stop, interrupted), lr = self.group.agree((got is None, self.stopping), lr, self.device)
        if interrupted and not self.stopping:  # a signal to one rank stops them all
            self.stopping, self.stop_signal = True, signal.SIGTERM  # as if it came here: 143
        return None if stop else (got, lr)

    def reached_end(self) -> bool:
        """This learner's own reasons to stop before the next update: a stop signal, run.total_agent_steps
        (the same on every rank: agent steps count every rank's unrolls), run.max_minutes."""
        if self.stopping or self.agent_steps >= self.cfg.run.total_agent_steps:
            return True
        if self.cfg.run.max_minutes and self.clock.elapsed() > 60 * self.cfg.run.max_minutes:
            log.info("reached run.max_minutes=%s", self.cfg.run.max_minutes)
            return True
        return False

    # -- several learners (distributed/learner/data_parallel.py) -------------------------------------------
    def sync_start(self) -> None:
        """Give every rank rank 0's weights, optimizer state, update step, agent steps and training seconds
        (fresh or resumed: identical initial weights too). Nothing with one learner."""
        meta = broadcast_state(self.model, self.optimizer, {"step": self.step, "agent_steps": self.agent_steps,
                                                            "elapsed_s": self.clock.elapsed_before},
                               self.group, self.device)
        self.step, self.agent_steps = int(meta["step"]), int(meta["agent_steps"])
        self.clock.elapsed_before = float(meta["elapsed_s"])

    def checkpoint_trained(self) -> None:
        """`checkpoint` between updates. With several learners every rank has acked what it trained on
        once they agreed to go on, so rank 0 records the run's trained count from Redis, not its own acks'
        (so does a learner whose ingest workers ack for it: up to learner.prefetch_batches acks may be
        on their way, which a crash's `rolled_back` would count too)."""
        if (self.group.distributed or self.ingest.workers is not None) and self.group.is_main:
            self.clock.unrolls_trained = self.ingest.trajectories.accounting()["trained"]
        self.checkpoint()

    def train(self, prepared: object, lr: float) -> dict[str, float]:
        """`train_on` the batch at learning rate `lr`; its seconds are counted in the metrics window."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        started = time.monotonic()
        stats = self.train_on(prepared)
        self.metrics.window.update_s += time.monotonic() - started
        return stats

    def record(self, agent_steps: int, headers: list[dict], stats: dict[str, float], replay_lags: list[int]) -> None:
        """Add the update just made to the metrics window (the agent steps it trained on, the policy lag of
        the unrolls of the entries with `headers`, its `stats`, the lags of the replayed unrolls), and
        log the window when it is due (rank 0)."""
        lags = [self.step - 1 - version for version in self.ingest.unroll_versions(headers)]
        self.metrics.window.add(agent_steps, lags, stats, replay_lags)
        now = time.monotonic()
        if now - self.metrics.window.start >= self.cfg.run.log_every_s and self.group.is_main:
            self.log_metrics(now)

    def train_on(self, prepared: Prepared) -> dict[str, float]:
        """One update on a batch of B unrolls (from `prepare`); publishes the weights on schedule.
        With K learners the gradient is that of all K batches. Frames count the agent steps consumed,
        K x F x T with F fresh unrolls per batch: replayed ones were counted when they were fresh."""
        batch = prepared.batch.to(self.device)
        unrolls = batch.action.shape[1] - len(prepared.replayed_versions)
        batch = self.mirror(batch)
        stats = learn_step(self.model, self.optimizer, batch, self.cfg.learner, self.head,
                           partial(average_gradients, group=self.group))  # (nothing with one learner)
        if stats["skipped_update"]:
            log.warning("update %d skipped: non-finite loss or gradient (loss %s); the batch held extreme values",
                        self.step + 1, stats["loss"])
        self.step += 1
        self.agent_steps += self.cfg.actor.unroll_length * unrolls * self.group.size
        if self.cfg.learner.redo_every and self.step % self.cfg.learner.redo_every == 0:
            self.recycle(batch)
        if self.step % self.cfg.learner.publish_every == 0 and self.group.is_main:
            self.params.publish(self.model.state_dict(), self.step, self.agent_steps)
        return stats

    def recycle(self, batch: Batch) -> None:
        """ReDo (agents.redo) over the observations of the batch just trained on: every learner recycles
        the same units (scores averaged over them, the same seed)."""
        recycled, units = recycle_dormant_units(self.model, self.optimizer, flatten_steps(batch.obs),
                                                self.cfg.learner.redo_threshold,
                                                seed=self.cfg.run.seed * 7919 + self.step,
                                                average=partial(average_tensor, group=self.group))
        if self.group.is_main:
            log.info("%s update %d: recycled %d of %d torso units (ReDo)", self.label, self.step, recycled, units)

    def finish(self) -> None:
        """Checkpoint and publish the final weights; tell actors the run is over unless interrupted.
        (Ranks other than 0 of several learners only log.)"""
        self.checkpoints.finished = not self.stopping
        if not self.group.is_main:
            log.info("%s done: %s updates, %s agent steps", self.label, f"{self.step:,}", f"{self.agent_steps:,}")
            self.metrics.close()
            return
        self.checkpoint_trained()  # first: it needs no Redis
        self.params.publish(self.model.state_dict(), self.step, self.agent_steps)
        if not self.stopping and self.player == MAIN:  # exploiters end with the main agent's run
            self.redis.set(keys.done(self.cfg.run.name), 1)
        self.lease.release()
        log.info("%s done: %s updates, %s agent steps; checkpoint %s", self.label, f"{self.step:,}", f"{self.agent_steps:,}",
                 self.checkpoints.path)
        self.metrics.close(report=self.player == MAIN and not self.stopping)  # interrupted: no figures, stop now

    def log_metrics(self, now: float) -> None:
        """Write the metrics window ending `now` (`LearnerMetrics.log`) with this learner's progress and the
        stream's delivery counts, those of earlier Redis servers of the run added (`Checkpoints.carry`)."""
        counts = self.checkpoints.carry(self.ingest.trajectories.accounting())
        self.metrics.log(now, step=self.step, agent_steps=self.agent_steps, elapsed_s=self.clock.elapsed(),
                         learning_rate=self.optimizer.param_groups[0]["lr"], counts=counts,
                         rolled_back=self.clock.rolled_back)


def run_learner(cfg: Config, redis_url: str, run_dir: Path, resume: bool = False, player: str = MAIN,
                learner_class: type = Learner, report: Callable[[Path, Tracker], None] | None = None,
                rank: int = 0, dist_url: str | None = None) -> int:
    """Entry point of `run.py learner` (`learner_class`: Learner, or A3C's parameter server): stop
    cleanly (final checkpoint) on SIGTERM/SIGINT. `report(run_dir, tracker)`, if given, logs the
    report's figures to the trackers at the end of the run. `rank`, `dist_url`: see `Learner`.
    Returns the exit code: 0 once the run is over, 128 + N when signal N stopped it before
    (`stopped_exit_code`; a rank stopped by another rank's signal: 143, as if by SIGTERM).
    Raises RedisUnavailable, DataParallelError (a peer rank died; rank 0 writes its checkpoint first),
    IngestWorkerError (an ingest worker failed; the checkpoint is written first)."""
    torch.set_num_threads(cfg.learner.num_threads)
    keep_freed_memory()
    learner = learner_class(cfg, redis_url, run_dir, resume, player, rank=rank, dist_url=dist_url)
    learner.metrics.report = report
    written = f"checkpoint at update {{}} written to {learner.checkpoints.path}"

    def lost_redis(e: Exception) -> str:
        learner.checkpoint()  # keep what was learned: the checkpoint is a local file
        return f"the learner lost Redis ({type(e).__name__}: {e}); {written.format(learner.step)}; `--resume` continues"

    def failed(e: Exception) -> str:
        # An ingest worker or a peer rank is gone. The update that failed has not stepped: the weights are
        # those of the last update (every rank) made.
        try:
            learner.checkpoint_trained()
            if learner.group.is_main:
                learner.lease.release()  # so that `--resume` needs not wait for it to lapse
        except redis.RedisError:
            learner.checkpoint()
        if isinstance(e, IngestWorkerError):
            return f"{e}; {written.format(learner.step)}; `--resume` continues (what the workers held is read again)"
        return f"{e}{'; ' + written.format(learner.step) if rank == 0 else ''}; `run.py train --resume RUN_DIR` continues"

    try:
        return run_role(learner, lost_redis,
                        lambda: learner.checkpoints.finished or run_is_over(learner.redis, cfg.run.name),
                        (IngestWorkerError, DataParallelError), failed)
    finally:
        learner.group.close()
