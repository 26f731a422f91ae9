"""What one bad node costs a run: the quick tier on 4 network-namespace nodes with one node
unreachable, against the same run with none, in one invocation.

Both runs are ``pytest acceptance/ -m quick`` from a controller namespace (the login node) on
cpu-local with its speed gates opened (`tests/integration/open_gates.py`: four nodes share this
machine's cores; the time is under test, not the floors), ``--rendezvous-timeout=20`` unless told
otherwise (the per-node probe deadline is that + 60 s of probe work). The bad
node is made unreachable in one of two ways (``--bad``):

- ``hang`` (default, the worst case): its link is cut at the switch and every command for it
  hangs, as ``ssh`` to a host that does not answer does (the remote-exec prefix is a small
  wrapper that sleeps for that one host): its probe job runs until the per-node probe deadline;
- ``cut``: its link is cut only; it can still be started, and its probe finds in seconds that no
  peer answers it.

The session sets the node aside after the probe and runs every job on the three others, so the
bad node should cost one probe deadline at most, never one per job (before the set-aside stage:
a 4-node rendezvous timing out in every job). The line ending in ``ratio`` is (bad run - healthy
run) / the per-node probe deadline; goal: at most 1.1. Runs alternate, healthy first, ``--rounds``
times each; the ratio is of the medians. In ``hang`` mode the bad node's probe job is stopped at
its deadline and its remote reaper (which hangs too) is given 2 s, not 15 (`launch.process`: its
agent log stayed empty, so nothing of the job ran there), and the session-start leftover scan,
which waits up to 30 s for a node, runs beside the probe instead of before it (`plugin`).

    flock /tmp/heavy.lock python benchmarks/set_aside_cost.py [--bad hang|cut] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "integration")]

from open_gates import open_gates_profile  # noqa: E402

from pytest_gpucluster.launch.base import REMOTE_PRESETS  # noqa: E402
from pytest_gpucluster.launch.job import rendezvous_deadline  # noqa: E402
from pytest_gpucluster.testbed.netns import NetnsUnavailable, create_testbed  # noqa: E402

PROBE_WORK_S = 60.0
HANG = """#!/bin/sh
# The remote-exec prefix for the benchmark: "wrap HOST PREFIX..." runs PREFIX, except for the bad
# host, where it hangs as ssh to a host that does not answer does.
if [ "$1" = "{bad}" ]; then exec sleep 3600; fi
shift
exec "$@"
"""


def run_quick(
    bed, tmp: Path, hostfile: Path, profiles: Path, remote: list[str], rendezvous_s: float
) -> tuple[float, dict]:
    results = tmp / "results"
    argv = [
        sys.executable, "-m", "pytest", "acceptance/", "-m", "quick", "--hw=cpu-local-open",
        f"--thresholds-dir={profiles}", f"--hostfile={hostfile}", f"--rendezvous-timeout={rendezvous_s:g}",
        f"--remote-exec={shlex.join(remote)}", f"--results-dir={results}",
        "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "_GPUCLUSTER", "GPUCLUSTER_"))}
    start = time.monotonic()
    subprocess.run(
        bed.exec_argv(bed.controller, argv), cwd=REPO, env=env, capture_output=True, timeout=1800, check=False
    )
    took = time.monotonic() - start
    data = json.loads((results / "results.json").read_text()) if (results / "results.json").is_file() else {}
    return took, data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bad", choices=("hang", "cut"), default="hang")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--rendezvous-timeout", type=float, default=20.0,
        help="seconds (the plugin's default is 120); the per-node probe deadline is this + 60",
    )  # fmt: skip
    args = parser.parse_args()
    deadline = rendezvous_deadline(1, args.rendezvous_timeout) + PROBE_WORK_S
    try:
        bed = create_testbed(4, controller=True)
    except NetnsUnavailable as exc:
        print(f"skipped: {exc}")
        return 0
    with bed, tempfile.TemporaryDirectory(prefix="set-aside-cost-") as tmp_text:
        tmp = Path(tmp_text)
        profiles = tmp / "profiles"
        open_gates_profile(profiles)
        hostfile = tmp / "hosts"
        hostfile.write_text(bed.hostfile_text(slots=1))
        bad = bed.names[-1]
        netns = list(REMOTE_PRESETS["netns"])
        wrap = tmp / "wrap"
        wrap.write_text(HANG.format(bad=bad))
        wrap.chmod(0o755)
        bad_remote = [str(wrap), "{host}", *netns] if args.bad == "hang" else netns
        times: dict[str, list[float]] = {"healthy": [], "bad": []}
        print(f"quick tier, 4 namespace nodes, cpu-local (gates opened); bad node {bad} ({args.bad}); "
              f"per-node probe deadline {deadline:g} s")  # fmt: skip
        for index in range(args.rounds):
            bed.set_link(bad, up=True)
            took, data = run_quick(
                bed, tmp / f"healthy{index}", hostfile, profiles, netns, args.rendezvous_timeout
            )
            times["healthy"].append(took)
            print(f"round {index + 1}: healthy {took:.1f} s, {data.get('signoff', {}).get('verdict', '?')}")
            bed.set_link(bad, up=False)
            took, data = run_quick(
                bed, tmp / f"bad{index}", hostfile, profiles, bad_remote, args.rendezvous_timeout
            )
            times["bad"].append(took)
            line = (data.get("nodes_used") or {}).get("line", "no node set aside")
            print(f"round {index + 1}: one bad node {took:.1f} s, {line}")
    healthy, bad_s = statistics.median(times["healthy"]), statistics.median(times["bad"])
    print(f"healthy run {healthy:.1f} s, run with {bad} {args.bad} {bad_s:.1f} s: {bad_s - healthy:+.1f} s")
    print(
        f"set-aside cost: extra time over the per-node probe deadline ({deadline:g} s), ratio {(bad_s - healthy) / deadline:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
