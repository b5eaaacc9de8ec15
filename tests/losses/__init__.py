"""Tests of impala_league/losses/."""
