"""The verdict layer: what the ranks (or a recorded log) measured, judged against the profile.

One module per acceptance area — `collectives`, `nccl` (+ `nccl_logs`, `nccl_hints`), `nvlink`
(+ `comparison`), `sft`, `burnin/` — each a set of pure functions from a profile section and
measured values to a list of `results.model.Check`, every threshold with the `ThresholdRef` of the
profile key it came from. The test hands the list to ``results.check_all``.

No pytest, no torch, no launching (``plans/`` says what runs, ``harness.py`` runs it).
"""
