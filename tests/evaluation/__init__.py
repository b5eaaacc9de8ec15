"""Tests of impala_league/evaluation/."""
