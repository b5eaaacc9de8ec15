"""Tests of impala_league/envs/."""
