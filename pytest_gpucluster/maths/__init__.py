"""Arithmetic both sides of the process boundary use: the parent (checks, profile physics,
burn-in) and the ranks (workloads).

- `metrics`: bus bandwidth factors, MFU, scaling efficiency, spreads — the formulas, named;
- `sweep`: nccl-tests' size and count semantics, and the summary of a collective sweep;
- `shapes`: the named transformer shapes the SFT workload trains and MFU counts.

Standard library only, and nothing from this package outside ``maths/``: a rank that imports it
pulls in no pytest, profiles or launcher code, and the parent no torch.
"""
