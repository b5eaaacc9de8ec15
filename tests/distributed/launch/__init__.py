"""Tests of impala_league/distributed/launch/."""
