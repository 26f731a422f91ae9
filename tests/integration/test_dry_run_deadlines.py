"""``pytest acceptance/ --hw=<profile> --gpucluster-dry-run`` on the shipped 8-GPU profiles lists
every job the suite would launch with its timeout, where the timeout comes from (the rendezvous
allowance included) and the run time it was set against; no timeout is below its estimate. Nothing is launched and no node is probed (a dry
run), so the hostfile's eight names need not exist. Stands for: a user on a login node checking the
plan before spending an allocation."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_gpucluster.checks.collectives import cases, scope_nodes
from pytest_gpucluster.plans.sft import scaling_counts, scaling_nodes
from pytest_gpucluster.profiles.loader import load_profile

REPO = Path(__file__).parents[2]
PLAN = re.compile(
    r"\[dry run\] plan: (?P<part>\S+): (?P<nodes>\d+) node\(s\) x \d+ rank\(s\), (?P<deadline>.*)$"
)
SECONDS = re.compile(r"^job timeout ([\d,.]+) s")
ESTIMATE = re.compile(r"; estimated run ([\d,.]+) s")
NODES = 8


def _plan(tmp_path: Path, profile: str) -> dict[str, str]:
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(f"gpu{i:02d} slots=8\n" for i in range(1, NODES + 1)))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "acceptance/", f"--hw={profile}", f"--hostfile={hosts}",
         "--gpucluster-dry-run", f"--results-dir={tmp_path / 'r'}", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-v", "-s"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("GPUCLUSTER_")},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "cannot plan" not in done.stdout, done.stdout
    return {m["part"]: m["deadline"] for line in done.stdout.splitlines() if (m := PLAN.search(line.strip()))}


def _number(pattern: re.Pattern[str], text: str) -> float:
    found = pattern.search(text)
    assert found, (pattern.pattern, text)
    return float(found[1].replace(",", ""))


def _expected_parts(profile: str) -> set[str]:
    """The SFT and sweep parts the profile asks for on NODES nodes, from the profile itself."""
    model = load_profile(profile).model
    rpn = model.cluster.effective_ranks_per_node
    names = {f"sft-{c.name}-{c.nodes}x{rpn}" for c in model.sft.cases if c.nodes <= NODES}
    if model.scaling is not None:
        names |= {
            f"sft-{model.scaling.case}-{scaling_nodes(model, n)}x{rpn}" for n in scaling_counts(model.scaling)
        }
    names |= {
        f"collectives-{c.id}" for c in cases(model.collectives) if scope_nodes(c.scope, NODES)[1] is None
    }
    return names


@pytest.mark.parametrize("profile", ["h200-spectrumx", "h800-ib"])
def test_every_job_shows_its_timeout_and_none_is_below_its_estimate(tmp_path, profile):
    plan = _plan(tmp_path, profile)
    expected = _expected_parts(profile)
    assert expected <= set(plan), sorted(expected - set(plan))
    for part, deadline in plan.items():
        timeout = _number(SECONDS, deadline)
        if part in expected:  # the jobs whose deadline is derived from their work carry an estimate
            assert _number(ESTIMATE, deadline) <= timeout, (part, deadline)
            assert "BELOW THE ESTIMATED RUN" not in deadline
        elif ESTIMATE.search(deadline):
            assert _number(ESTIMATE, deadline) <= timeout, (part, deadline)
    sweeps = [d for p, d in plan.items() if p.startswith("collectives-")]
    assert sweeps and all("derived from the work" in d for d in sweeps), sweeps
    assert all("rendezvous allowance" in d for d in sweeps), sweeps
    # the burn-in jobs on all 8 nodes: their work plus what the rendezvous grants 8 nodes (134 s)
    burnin = {p: d for p, d in plan.items() if p.startswith("burnin-")}
    assert {"burnin-health", "burnin-straggler-sweep", "burnin-fabric"} <= set(burnin), sorted(plan)
    assert all("grants 8 node(s) 134 s (2.23 min) to start" in d for d in burnin.values()), burnin
    # the NVLink parts and the NCCL probe too (they kept a fixed 300 s before), on the profile's nodes
    fixed_before = {p: d for p, d in plan.items() if p.startswith(("nvlink-", "nccl-probe"))}
    assert {"nvlink-inventory", "nvlink-traffic", "nccl-probe"} <= set(fixed_before), sorted(plan)
    assert all("rendezvous allowance" in d and "grants " in d for d in fixed_before.values()), fixed_before
