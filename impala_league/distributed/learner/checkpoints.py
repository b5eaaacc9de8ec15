"""A learner's checkpoint: when it is written, what goes in it, and what a resumed learner takes back.

The file's format (one safetensors file: tensors, config, meta; atomic writes) is agents/checkpoint.py's.
`Checkpoints` owns the file and the state of the run that it carries from one learner process to the
next, beside the model and the optimizer: the training clock (distributed/learner/clock.py: the training
seconds and the stream's trained count, which tells a resumed learner how many acked unrolls its model
lacks), the delivery counters of metrics.jsonl (so that they continue on a new Redis), the league's
resets and whether the run finished.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch

from impala_league.agents.checkpoint import (CheckpointError, check_network, load_optimizer_state, model_state,
                                             read_checkpoint, read_meta, save_checkpoint)
from impala_league.config import Config, to_yaml, without_secrets
from impala_league.distributed.launch.ownership import owns_run_dir
from impala_league.distributed.learner.checkpoint_history import CheckpointHistory
from impala_league.distributed.learner.clock import TrainingClock
from impala_league.evaluation.bots import GAMES
from impala_league.league.players import MAIN, checkpoint_dir
from impala_league.records import upgraded

log = logging.getLogger("learner")

CHECKPOINT_NAME = "latest.safetensors"
COUNTERS = ("produced", "trained", "dead_lettered", "env_steps")  # counts that only grow


class Checkpoints:
    """Learner `player`'s checkpoint, `checkpoints/[<player>/]latest.safetensors` under the run directory
    (`path`), and the run's state it carries across processes (each value is the checkpoint meta's key
    of the same name):

    elapsed_s, unrolls_trained: the training clock (`clock`, a `TrainingClock`): the run's training
      seconds, and `{ns}:traj:trained` as of the last ack. After a crash, the unrolls acked after the
      checkpoint was written were trained on by updates the resumed model lacks: `count_rolled_back`
      counts them (`clock.rolled_back`, see docs/architecture.md).
    counters: the delivery counters of metrics.jsonl (COUNTERS). On a new Redis (an embedded one is new
      every run) they start again from 0, so `carry` adds the checkpoint's values (`counter_base`).
    league_resets: the league's resets of this learner applied to its weights, so that a reset asked for
      while it was down is applied on resume; None until restored (the learner then reads the league's).
    finished: the run reached its end (not stopped by a signal).

    Rank 0 alone writes it (`is_main`), and only while the run directory is its launcher's. Without a
    league, in a board game, the main agent's checkpoints are also copied to the history
    (distributed/learner/checkpoint_history.py) for the end-of-run evaluation to play.
    """

    def __init__(self, cfg: Config, run_dir: Path, player: str, env: str, is_main: bool, label: str):
        """env: the env's name, recorded in the meta; label: the learner in log lines."""
        self.cfg = cfg
        self.path = checkpoint_dir(Path(run_dir), player) / CHECKPOINT_NAME
        self.env = env
        self.is_main = is_main
        self.label = label
        self.history = (CheckpointHistory(self.path)
                        if player == MAIN and not cfg.league.enabled and cfg.env.name in GAMES else None)
        self.clock = TrainingClock()
        self.last_saved = 0.0  # monotonic time of the last `due` checkpoint
        self.restored_counters: dict[str, int] = {}
        self.counter_base: dict[str, int] = {}
        self.last_counters: dict[str, int] = {}
        self.league_resets: int | None = None
        self.finished = False

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[int, int]:
        """Load `model` and `optimizer` and the carried state; returns the update step and agent steps trained. The
        optimizer's hyperparameters stay the config's. Raises CheckpointError if they do not fit this config."""
        tensors, metadata = read_checkpoint(self.path)
        check_network(metadata, self.cfg, self.path)
        fresh_groups = optimizer.state_dict()["param_groups"]
        try:
            model.load_state_dict(model_state(tensors))
            saved_groups = json.loads(metadata.get("optim_groups", "[]"))
            marker = "betas" if self.cfg.learner.optimizer == "adam" else "alpha"  # Adam's vs RMSprop's own key
            if len(saved_groups) != len(fresh_groups) or not all(marker in g for g in saved_groups):
                raise ValueError(f"its optimizer state is not that of learner.optimizer={self.cfg.learner.optimizer}")
            load_optimizer_state(optimizer, tensors, metadata)
            meta = upgraded(json.loads(metadata["meta"]))
            step, agent_steps = int(meta["step"]), int(meta["agent_steps_trained"])
            self.league_resets = int(meta.get("league_resets", 0))
            self.clock.restore(meta)
            self.restored_counters = {k: int(v) for k, v in meta.get("counters", {}).items()}
        except (RuntimeError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"--resume: {self.path} does not fit this run's config (were "
                                  f"env.name, agent.* or learner.optimizer changed?): {e}".splitlines()[0]) from None
        # Hyperparameters come from the config, so `--resume --set learner.learning_rate=...` takes effect.
        for group, fresh in zip(optimizer.param_groups, fresh_groups):
            group.update({k: v for k, v in fresh.items() if k != "params"})
        log.info("resumed from %s at update %s, %s agent steps", self.path, f"{step:,}", f"{agent_steps:,}")
        return step, agent_steps

    def check_fresh_start(self) -> None:
        """A learner started without --resume: refuse where the run directory holds this learner's
        checkpoint, which the fresh run's first checkpoint (of an earlier update) would replace, unless
        learner.overwrite_checkpoint. Only rank 0 writes checkpoints, so only it checks. Raises
        CheckpointError saying what to do."""
        if not self.is_main or self.cfg.learner.overwrite_checkpoint or not self.path.exists():
            return
        try:
            held = f"the checkpoint of update {int(read_meta(self.path)['step'])}"
        except (CheckpointError, KeyError, TypeError, ValueError):
            held = "a checkpoint"
        raise CheckpointError(f"{self.path} holds {held} and {self.label} was started without --resume: pass "
                              "--resume to continue from it, or set learner.overwrite_checkpoint=true to train "
                              "from scratch and replace it")

    def save(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int, agent_steps: int) -> None:
        """Save model, optimizer, the update step and agent steps trained and the carried state, unless the run
        directory is no longer ours (the launcher that owns it died: a new owner may have resumed the run
        meanwhile). Rank 0 alone writes it."""
        if not self.is_main:
            return
        if not owns_run_dir():
            log.warning("%s: not writing %s: the launcher that owned the run directory is gone", self.label, self.path)
            return
        save_checkpoint(self.path, model, optimizer, to_yaml(without_secrets(self.cfg)),
                        {"step": step, "agent_steps_trained": agent_steps, "params_version": step,
                         "league_resets": self.league_resets, **self.clock.meta(),
                         "env": self.env, "time": time.time(),
                         "counters": self.last_counters or self.counter_base,
                         "finished": self.finished})
        if self.history is not None:
            self.history.update()

    @property
    def unrolls_trained(self) -> int:
        """The stream's trained count the next checkpoint records (the clock's)."""
        return self.clock.unrolls_trained

    @unrolls_trained.setter
    def unrolls_trained(self, trained: int) -> None:
        self.clock.unrolls_trained = trained

    def start(self, now: float) -> None:
        """Training starts at `now` (monotonic seconds): the clock counts this process's seconds from it,
        and the first `due` checkpoint is learner.checkpoint_every_s after it."""
        self.clock.start(now)
        self.last_saved = now

    def due(self, now: float) -> bool:
        """Whether `learner.checkpoint_every_s` has passed since the last checkpoint that was due (at
        `now`, monotonic seconds); if so, the next one is due that long after `now`."""
        if now - self.last_saved < self.cfg.learner.checkpoint_every_s:
            return False
        self.last_saved = now
        return True

    def count_rolled_back(self, trained: int) -> None:
        """After a resume, with the stream's trained count now (`trained`): the clock counts the unrolls
        rolled back (`TrainingClock.count_rolled_back`). A count below the checkpoint's is a new Redis,
        whose delivery counters start again: the checkpoint's are added to them from now on."""
        if self.clock.count_rolled_back(trained):
            self.counter_base = dict(self.restored_counters)  # a new Redis: its counts restarted

    def carry(self, counts: dict[str, float]) -> dict[str, float]:
        """The stream's `accounting()` with the counters of earlier Redis servers of the run added
        (COUNTERS); the next checkpoint records them."""
        counts = {k: v + self.counter_base.get(k, 0) if k in COUNTERS else v for k, v in counts.items()}
        self.last_counters = {k: counts[k] for k in COUNTERS}
        return counts
