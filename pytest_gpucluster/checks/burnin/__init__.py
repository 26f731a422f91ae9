"""Burn-in verdicts: per-rank and per-GPU health, stragglers, counters and versions as `Check` s."""
