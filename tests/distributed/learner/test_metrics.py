"""The learner's metrics (impala_league/distributed/learner/metrics.py): the warnings it gives once."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from impala_league.distributed.learner.metrics import DEAD_UNITS_WARNING, LearnerMetrics


def test_dead_units_warn_once_above_the_threshold(caplog):
    metrics = SimpleNamespace(warned_dead_units=False)
    with caplog.at_level(logging.WARNING, logger="learner"):
        LearnerMetrics.warn_dead_units(metrics, {"dead_units": DEAD_UNITS_WARNING})  # not above: quiet
        assert not caplog.records
        LearnerMetrics.warn_dead_units(metrics, {"dead_units": 0.99})
        LearnerMetrics.warn_dead_units(metrics, {"dead_units": 0.99})
    assert len(caplog.records) == 1 and "99% of the torso's output units" in caplog.text
    assert "learner.learning_rate" in caplog.text and "learner.adam_eps" in caplog.text
    assert "learner.redo_every" in caplog.text
