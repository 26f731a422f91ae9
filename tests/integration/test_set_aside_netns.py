"""One node's link cut before the run: it is set aside and named, the three others are measured.

Four network-namespace nodes and a controller namespace (pytest runs there, the login node), the
real suite's quick tier (``acceptance/ -m quick``) on cpu-local with its speed gates opened
(`open_gates`: four nodes share two cores; the plumbing is under test). Node 3's link is cut at the
switch before the run: it can still be started through the remote-exec prefix, but no packet
reaches it. The session must

- find it in the per-node probe (its peers get no answer from it, it gets none from them), set it
  aside with its reason and action, and run every job on the three others, in bounded time;
- record per-node burn-in measurements for the three healthy nodes, and sign NOT FIT naming that
  node alone; the results line says ``measured on 3 of 4 nodes; set aside: <node> (...)``;
- with ``--gpucluster-exclude <node>``, the inventory and burn-in of the same tier sign FIT on the
  three, the exclusion recorded.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from netns_bed import netns_bed_or_skip
from open_gates import open_gates_profile

REPO = Path(__file__).parents[2]
_DROP_ENV = ("PYTEST_XDIST", "PYTEST_ADDOPTS", "_GPUCLUSTER", "GPUCLUSTER_")
BOUND_S = 420
"""Far above the run's healthy time (~40-90 s under load) and below what one deadline per job on
the cut node would cost (a 4-node rendezvous timing out, job after job)."""


def _run(
    bed, tmp: Path, hostfile: Path, profiles: Path, *extra: str
) -> tuple[subprocess.CompletedProcess[str], dict, float]:
    results = tmp / "results"
    argv = [
        sys.executable, "-m", "pytest", "acceptance/", "-m", "quick", "--hw=cpu-local-open",
        f"--thresholds-dir={profiles}", f"--hostfile={hostfile}", "--rendezvous-timeout=30",
        f"--remote-exec={shlex.join(bed.remote_exec_template)}", f"--results-dir={results}",
        "-p", "no:cacheprovider", "-p", "no:xdist", "-q", *extra,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROP_ENV)}
    start = time.monotonic()
    done = subprocess.run(
        bed.exec_argv(bed.controller, argv), cwd=REPO, env=env, capture_output=True, text=True,
        timeout=BOUND_S + 60, check=False,
    )  # fmt: skip
    took = time.monotonic() - start
    data = json.loads((results / "results.json").read_text()) if (results / "results.json").is_file() else {}
    return done, data, took


def test_a_cut_node_is_set_aside_named_and_the_others_measured_then_excluded_fit(tmp_path):
    profiles = tmp_path / "profiles"
    open_gates_profile(profiles)
    with netns_bed_or_skip(4, controller=True) as bed:
        assert bed.controller is not None
        hostfile = tmp_path / "hosts"
        hostfile.write_text(bed.hostfile_text(slots=1))
        *healthy, cut = bed.names
        bed.set_link(cut, up=False)

        done, data, took = _run(bed, tmp_path / "cut", hostfile, profiles)
        out = done.stdout + done.stderr
        assert took < BOUND_S, out[-4000:]
        assert done.returncode == 1, out[-5000:]
        used = data["nodes_used"]
        assert used["usable"] == healthy and used["measured_on"] == 3 and used["of"] == 4, used
        (aside,) = used["set_aside"]
        assert aside["host"] == cut and aside["action"] == "reseat/replace cable or NIC", aside
        assert aside["reason"] == (
            "unreachable: no TCP answer from 3 of the 3 peers it tried, nor from it to 3 of the 3 that tried it"
        ), aside
        line = (
            f"measured on 3 of 4 nodes; set aside: {cut} ({aside['reason']} -> reseat/replace cable or NIC)"
        )
        assert used["line"] == line and f"nodes: {line}" in out, out[-4000:]
        assert f"Nodes: {line}" in (tmp_path / "cut" / "results" / "report.md").read_text()

        # Per-node burn-in values for the three healthy nodes, none for the cut one.
        burnin_hosts = {
            m["labels"].get("host") for m in data["measurements"] if m["metric"].startswith("burnin.")
        }
        assert set(healthy) <= burnin_hosts and cut not in burnin_hosts, burnin_hosts
        # NOT FIT, naming the cut node alone (the healthy nodes' own checks passed).
        signoff = data["signoff"]
        assert signoff["fit"] is False and cut in signoff["why"], signoff
        assert not any(h in signoff["why"] for h in healthy), signoff
        failed = [o["test_id"] for o in data["outcomes"] if o["outcome"] == "failed"]
        assert failed == ["gpucluster::set-aside"], [o for o in data["outcomes"] if o["outcome"] == "failed"]
        print(f"cut link: {took:.1f} s, {len(data['measurements'])} values, {line}")

        # Excluded: the same nodes, but only the inventory and the per-node burn-in (the cut run above
        # already showed every quick-tier check passing on the three): what is new here is the
        # exclusion, decided before the probe, and a FIT verdict on measured values.
        done, data, took = _run(
            bed, tmp_path / "excluded", hostfile, profiles, f"--gpucluster-exclude={cut}",
            "-k", "test_inventory or test_rank_health_cpu",
        )  # fmt: skip
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-5000:]
        assert data["signoff"]["fit"] is True, data["signoff"]
        burnin_hosts = {
            m["labels"].get("host") for m in data["measurements"] if m["metric"].startswith("burnin.")
        }
        assert set(healthy) <= burnin_hosts and cut not in burnin_hosts, burnin_hosts
        assert data["nodes_used"]["excluded"] == [cut] and data["nodes_used"]["set_aside"] == []
        assert data["settings"]["gpucluster_exclude"]["value"] == [cut]
        assert f"measured on 3 of 4 nodes; excluded (--gpucluster-exclude): {cut}" in out
        print(f"excluded: {took:.1f} s, {data['signoff']['verdict']}")
