"""Tests of impala_league/analysis/."""
