"""The acceptance suite: one test module per area, run by the plugin against a hardware profile.

From a checkout it is the top-level ``acceptance/`` (``pytest acceptance/ --hw=<profile>``); in an
installed wheel it is the package ``pytest_gpucluster.acceptance`` (pyproject.toml's package-dir
maps one to the other), run with ``pytest --pyargs pytest_gpucluster.acceptance --hw=<profile>``.

This file makes the directory a regular package, which is what lets the wheel carry it and
``--pyargs`` find it: pytest refuses a namespace package there ("module or package not found").
Keep it free of imports: pytest imports it before every test module of the suite.
"""
