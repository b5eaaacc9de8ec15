"""Tests of impala_league/league/."""
