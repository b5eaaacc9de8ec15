"""Tests of impala_league/deploy/."""
