"""Tests of impala_league/distributed/learner/."""
