"""The training clock (impala_league/distributed/learner/clock.py): the run's seconds and trained count across
learner processes, and the checkpoint keys that carry them (distributed/learner/checkpoints.py)."""

from __future__ import annotations

import json
import logging
import time

import pytest

from impala_league.agents.checkpoint import read_checkpoint
from impala_league.agents.model import make_model
from impala_league.distributed.learner.checkpoints import Checkpoints
from impala_league.distributed.learner.clock import TrainingClock
from impala_league.distributed.learner.update import make_optimizer
from impala_league.envs.registry import env_spec
from tests.distributed.test_faults import small_config


def test_the_clock_adds_this_processs_seconds_to_the_restored_ones():
    clock = TrainingClock()
    assert clock.elapsed() == 0.0  # not started: no seconds of this process
    clock.restore({"elapsed_s": 90.5, "unrolls_trained": 12})
    assert clock.elapsed(now=1000.0) == 90.5
    clock.start(1000.0)
    assert clock.elapsed(now=1030.0) == 120.5
    assert clock.restored_trained == 12 and clock.unrolls_trained == 0  # the stream's count is read on resume


def test_an_old_checkpoint_without_the_clocks_keys_restores_a_clock_at_zero():
    clock = TrainingClock()
    clock.restore({"step": 3, "agent_steps_trained": 12})
    assert clock.elapsed() == 0.0 and clock.restored_trained == 0
    with pytest.raises(ValueError):
        clock.restore({"elapsed_s": "soon"})


def test_rolled_back_unrolls_are_those_acked_after_the_checkpoint(caplog):
    clock = TrainingClock()
    assert not clock.count_rolled_back(5) and clock.rolled_back == 0  # a fresh run: nothing restored
    clock.restore({"unrolls_trained": 10})
    with caplog.at_level(logging.WARNING, logger="learner"):
        assert not clock.count_rolled_back(14)
    assert clock.rolled_back == 4 and clock.unrolls_trained == 14 and "4 unrolls acked after the checkpoint" in caplog.text
    resumed = TrainingClock()
    resumed.restore({"unrolls_trained": 10})
    assert resumed.count_rolled_back(3) and resumed.rolled_back == 0  # below the checkpoint's: a new Redis


def test_checkpoints_save_and_restore_the_clock_under_the_meta_keys_they_always_had(tmp_path, run_name):
    cfg = small_config(run_name, tmp_path)
    model = make_model(env_spec("tictactoe"), cfg.agent)
    saved = Checkpoints(cfg, tmp_path / run_name, "main", "tictactoe", True, "learner")
    saved.clock.restore({"elapsed_s": 50.0})
    saved.start(time.monotonic() - 30.0)  # this process has trained 30 s
    saved.unrolls_trained, saved.league_resets = 9, 0
    saved.save(model, make_optimizer(model, cfg.learner), step=3, agent_steps=24)
    meta = json.loads(read_checkpoint(saved.path)[1]["meta"])
    assert meta["unrolls_trained"] == 9 and 80.0 <= meta["elapsed_s"] < 90.0 and meta["step"] == 3
    restored = Checkpoints(cfg, tmp_path / run_name, "main", "tictactoe", True, "learner")
    assert restored.restore(model, make_optimizer(model, cfg.learner)) == (3, 24)
    assert restored.clock.elapsed() == meta["elapsed_s"] and restored.clock.restored_trained == 9
