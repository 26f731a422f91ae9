"""Rank-side code: what runs inside every rank of a launched job.

Depends on the standard library and torch only — never on pytest, profiles or launchers.
"""
