"""The learner process (impala_league/distributed/learner/role.py): its loop's ends as the training clock
sees them. The update's math is tested in test_update.py, its reads in test_ingest.py, test_replay.py
and tests/distributed/test_delivery.py, several learners in test_data_parallel.py."""

from __future__ import annotations

import json

import pytest

from impala_league.agents.checkpoint import read_checkpoint
from tests.distributed.test_faults import small_config


@pytest.mark.redis
def test_a_resumed_learner_counts_the_runs_earlier_seconds_and_stops_at_max_minutes(tmp_path, redis_url, run_name):
    """A learner whose checkpoint recorded 61 s of training, resumed under run.max_minutes=1, trains
    nothing: the budget counts the run's seconds, not the process's. Its final checkpoint keeps them."""
    from impala_league.distributed.learner.role import Learner

    cfg = small_config(run_name, tmp_path, "run.max_minutes=1")
    first = Learner(cfg, redis_url, tmp_path / run_name)
    assert first.clock is first.checkpoints.clock and not first.reached_end()
    first.clock.elapsed_before, first.clock.unrolls_trained = 61.0, 7  # as if earlier processes had trained
    first.checkpoint()
    first.metrics.close()
    again = Learner(small_config(run_name, tmp_path, "run.max_minutes=1"), redis_url, tmp_path / run_name, resume=True)
    assert again.clock.elapsed() == pytest.approx(61.0, abs=1.0) and again.clock.restored_trained == 7
    assert again.reached_end()
    again.run()
    assert again.step == 0
    meta = json.loads(read_checkpoint(again.checkpoints.path)[1]["meta"])
    assert meta["step"] == 0 and 61.0 <= meta["elapsed_s"] < 70.0 and meta["finished"]


@pytest.mark.redis
def test_a_fresh_learner_refuses_to_train_over_a_checkpoint_unless_told_to(tmp_path, redis_url, run_name):
    """Started without --resume where the run directory holds a checkpoint (of update 386), the learner
    stops with one line saying what to do; learner.overwrite_checkpoint=true starts it from scratch."""
    from impala_league.agents.checkpoint import CheckpointError, read_meta
    from impala_league.distributed.learner.role import Learner

    first = Learner(small_config(run_name, tmp_path), redis_url, tmp_path / run_name)
    first.step = 386
    first.checkpoint()
    first.metrics.close()
    with pytest.raises(CheckpointError) as refused:
        Learner(small_config(run_name, tmp_path), redis_url, tmp_path / run_name)
    message = str(refused.value)
    assert "\n" not in message and "update 386" in message and "--resume" in message
    assert "learner.overwrite_checkpoint=true" in message
    assert read_meta(first.checkpoints.path)["step"] == 386  # untouched
    resumed = Learner(small_config(run_name, tmp_path), redis_url, tmp_path / run_name, resume=True)
    assert resumed.step == 386
    resumed.metrics.close()
    overwrite = small_config(run_name, tmp_path, "learner.overwrite_checkpoint=true")
    fresh = Learner(overwrite, redis_url, tmp_path / run_name)
    assert fresh.step == 0
    fresh.metrics.close()
