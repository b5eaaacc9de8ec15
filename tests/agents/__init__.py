"""Tests of impala_league/agents/."""
