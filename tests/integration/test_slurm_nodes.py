"""Slurm on several nodes (`slurm_netns`: slurmctld and three slurmds, each node a network namespace
with its own address, ``proctrack/cgroup``), through the package's real launcher:

- tasks mode with hosts given in reverse of Slurm's order: rank 0 is where Slurm put task 0 (its
  first node) and every rank met there; with ``MASTER_ADDR`` the first host given, ranks 1-2 would
  wait on a node where nothing listens until the job's deadline;
- a pairwise round whose suspect sorts after its partner completes;
- ``--hw=auto`` in ``salloc --exclusive`` without a GPU request: the probe's recorded argv asks for
  the nodes' GPUs (``--gres=gpu:8`` from ``scontrol show node``), the probe step gets them, and two
  nodes without a GPU are an error naming what was probed and how, not cpu-local;
- the NVML XID listener (the stand-in ``pynvml``, standin_pynvml.py): detached inside a
  job, as before, it is killed when that job's step ends (proctrack/cgroup); held as the controller's
  own ``srun --overlap`` step it survives the steps after it, sees an XID injected between them, is
  stopped by the last reading, and a step still there at the session's end is cancelled with no
  process left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_netns import NetnsSlurm, netns_slurm
from standin_pynvml import env as nvml_env
from standin_pynvml import gpus, write_node

from pytest_gpucluster.burnin.runner import ClusterPairRunner
from pytest_gpucluster.cluster.hostfile import read_hostfile
from pytest_gpucluster.cluster.spec import ClusterSpec
from pytest_gpucluster.launch import get_launcher
from pytest_gpucluster.launch.job import COMMANDS_FILE, Cluster
from pytest_gpucluster.launch.xid_step import hold_listener
from pytest_gpucluster.workloads import basic

REPO = Path(__file__).parents[2]
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def slurm_nodes(tmp_path_factory):
    with netns_slurm(tmp_path_factory.mktemp("nslurm"), nodes=3) as slurm, pytest.MonkeyPatch.context() as mp:
        for key in [k for k in os.environ if k.startswith("SLURM_")]:
            mp.delenv(key)  # an outer allocation (CI inside Slurm) must not leak in
        mp.setenv("SLURM_CONF", str(slurm.conf))
        mp.setenv("PATH", slurm.env["PATH"])
        mp.setenv("PYTHONPATH", os.pathsep.join([str(HERE), str(REPO), os.environ.get("PYTHONPATH", "")]))
        yield slurm


def _cluster(hosts, jobs: Path, **launcher) -> Cluster:
    spec = ClusterSpec(hosts=tuple((h, 1) for h in hosts), nproc_per_node=1, backend="gloo", source="slurm")
    return Cluster(spec, get_launcher("slurm", mode="tasks", **launcher), jobs)


def _allocate(slurm: NetnsSlurm, name: str, *options: str) -> tuple[str, str]:
    done = slurm.run("salloc", "--no-shell", "--immediate=20", f"--job-name={name}", *options, timeout=40)
    job = next((line.split()[0] for line in slurm.jobs() if f" {name} " in line), None)
    assert job is not None, done.stdout + done.stderr
    return job, slurm.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip()


def test_tasks_mode_puts_rank_0_on_slurms_first_node_whatever_the_hostfile_order(slurm_nodes, tmp_path):
    first = slurm_nodes.nodes[0]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("".join(f"{host} slots=1\n" for host in reversed(slurm_nodes.nodes)))
    spec = ClusterSpec.from_hostfile(read_hostfile(hostfile), 1, "gloo")
    assert spec.host_names[0] != first  # the hostfile's first host is Slurm's last node
    cluster = Cluster(spec, get_launcher("slurm", mode="tasks"), tmp_path / "jobs")
    result = cluster.run("slurm_ranks:all_reduce_master", timeout=60, check=False)
    assert result.ok, result.failure_report()
    assert [v["sum"] for v in result.values] == [6.0, 6.0, 6.0]
    assert result.ranks[0].host == first  # task 0 where Slurm put it...
    assert {v["master"] for v in result.values} == {first}  # ...and every rank met there
    (command,) = result.commands
    assert f"--nodelist={','.join(spec.host_names)}" in command.argv  # given in the hostfile's order
    assert command.env["GPUCLUSTER_MASTER_ADDR_FROM"] == "SLURM_STEP_NODELIST"


def test_a_pairwise_round_whose_suspect_sorts_after_its_partner_completes(slurm_nodes, tmp_path):
    partner, _, suspect = slurm_nodes.nodes  # the suspect sorts after its known-good partner
    runner = ClusterPairRunner(
        _cluster(slurm_nodes.nodes, tmp_path / "jobs"), nproc_per_node=1, size_bytes=64 << 10, iters=3,
        timeout_s=60, concurrent=False,
    )  # fmt: skip
    [result] = runner(2, [(suspect, partner)])
    assert result.error is None and result.busbw is not None and result.busbw > 0, result
    [job] = [d for d in (tmp_path / "jobs").iterdir() if d.is_dir()]
    rank0 = json.loads((job / "rank-0.json").read_text())
    assert rank0["host"] == partner, rank0


def test_hw_auto_in_an_exclusive_allocation_without_a_gpu_request_asks_for_the_nodes_gpus(
    slurm_nodes, tmp_path
):
    job_id, nodelist = _allocate(slurm_nodes, "gc-auto", "--exclusive", "--nodes=2")
    try:
        (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("GPUCLUSTER_", "_GPUCLUSTER", "PYTEST_"))
        }
        env |= {"SLURM_JOB_ID": job_id, "SLURM_JOB_NODELIST": nodelist}
        results = tmp_path / "results"
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "test_one.py", "--hw=auto", "--launcher=slurm", "--slurm-mode=tasks",
             "--forward-env=SLURM_STEP_GPUS", f"--results-dir={results}", "-p", "no:cacheprovider",
             "-p", "no:xdist", "-q"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        out = done.stdout + done.stderr
        probes = [d for d in (results / "jobs").iterdir() if "node-probe" in d.name]
        argvs = [c["argv"] for d in probes for c in json.loads((d / COMMANDS_FILE).read_text())]
        assert argvs and all(a[0].endswith("srun") and "--gres=gpu:8" in a for a in argvs), (
            argvs
        )  # scontrol's Gres
        ranks = [json.loads(f.read_text()) for d in probes for f in sorted(d.glob("rank-*.json"))]
        # Slurm gave the probe step the nodes' GPUs (without the request: none, the job being exclusive)
        assert [r["value"]["env"].get("SLURM_STEP_GPUS") for r in ranks] == ["0,1,2,3,4,5,6,7"] * 2, ranks
        assert done.returncode != 0, out[-3000:]
        hosts = ", ".join(slurm_nodes.nodes[:2])
        assert f"--hw=auto found no GPU on any of the 2 Slurm nodes {hosts}: the probe (probe job" in out, (
            out[-3000:]
        )
        assert "through srun --gres=gpu:8, and the nodes said: nodes " in out, out[-3000:]
        assert "cpu-local" not in json.dumps(_profile(results)), out[-3000:]
    finally:
        slurm_nodes.run("scancel", job_id)


def _profile(results: Path) -> dict:
    path = results / "results.json"
    return json.loads(path.read_text()).get("profile", {}) if path.exists() else {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().split(")")[-1].split()[0] != "Z"


def _pids_with(needle: str) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if needle.encode() in handle.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def test_the_xid_listener_held_as_an_overlap_step_outlives_every_job_step_and_ends_with_the_session(
    slurm_nodes, tmp_path, monkeypatch
):
    nodes = slurm_nodes.nodes
    for node in nodes:  # one GPU each; an XID queued in xid-<node>.json reaches that node's NVML
        write_node(tmp_path / f"nvml-{node}.json", gpus(["00000000:1B:00.0"]),
                   xid_queue=str(tmp_path / "xid-{host}.json"))  # fmt: skip
    for key, value in nvml_env(tmp_path / "nvml-{host}.json", [os.environ["PYTHONPATH"]]).items():
        monkeypatch.setenv(key, value)
    job_id, _ = _allocate(slurm_nodes, "gc-xid", "--exclusive", f"--nodes={len(nodes)}")
    monkeypatch.setenv("SLURM_JOB_ID", job_id)  # pytest inside salloc: jobs are steps of it
    cluster = _cluster(nodes, tmp_path / "jobs", device="cuda", gpus_per_node=8)
    try:
        # As before: detached inside the first reading's job. proctrack/cgroup kills it with the step.
        old = cluster.run("slurm_ranks:start_detached", options={"dir": str(tmp_path / "old-{host}")},
                          timeout=60, init_process_group=False, pick_device=False)  # fmt: skip
        assert all(v["started"] for v in old.values), old.values
        pids = [v["pid"] for v in old.values]
        assert slurm_nodes.wait_until(lambda: not any(_alive(p) for p in pids), 10), (
            "the step's leftovers lived"
        )

        # Held as the controller's own step: it outlives the job steps after it.
        state = str(tmp_path / "held-{host}")
        step, why = hold_listener(cluster, state, 300.0, len(nodes), tmp_path / "xid-watch.log")
        assert step is not None, why
        assert "--overlap" in step.argv() and "--gpus-per-node=8" in step.argv()
        listeners = [int((tmp_path / f"held-{n}" / "pid").read_text()) for n in nodes]
        first = cluster.run("slurm_ranks:held", options={"dir": state}, timeout=60, init_process_group=False,
                            pick_device=False)  # fmt: skip
        assert [v["listening"] for v in first.values] == [True] * len(nodes), first.values
        assert (
            "--gpus-per-node=8" in first.commands[0].argv
        )  # the job steps get the GPUs the listener overlaps
        cluster.run(basic.noop, timeout=60, init_process_group=False, pick_device=False)  # "the NCCL tests"
        (tmp_path / f"xid-{nodes[1]}.json").write_text(json.dumps({"xid": 79}))  # a GPU falls off the bus
        cluster.run(basic.noop, timeout=60, init_process_group=False, pick_device=False)  # "the SFT test"
        assert slurm_nodes.wait_until(lambda: not (tmp_path / f"xid-{nodes[1]}.json").exists(), 10)
        assert all(_alive(p) for p in listeners) and step.running
        assert any(step.name in line for line in slurm_nodes.steps()), slurm_nodes.steps()

        last = cluster.run("slurm_ranks:collect", options={"dir": state}, timeout=60, init_process_group=False,
                           pick_device=False)  # fmt: skip
        seen = {v["host"]: [e["xid"] for e in v["events"]] for v in last.values}
        assert seen == {nodes[0]: [], nodes[1]: [79], nodes[2]: []}, last.values
        assert step.proc.wait(timeout=15) == 0  # the last reading stopped it: the step ended by itself
        step.stop()
        assert step.cancelled == []

        # A session that ends before its last reading: the step is cancelled, nothing is left.
        again, why = hold_listener(
            cluster, str(tmp_path / "again-{host}"), 300.0, len(nodes), tmp_path / "x2.log"
        )
        assert again is not None, why
        listeners = [int((tmp_path / f"again-{n}" / "pid").read_text()) for n in nodes]
        again.stop()
        assert len(again.cancelled) == 1 and again.proc.poll() is not None, again.cancelled
        assert slurm_nodes.wait_until(lambda: not any(_alive(p) for p in listeners), 10)
        assert _pids_with(f"GPUCLUSTER_JOB_ID={again.name}") == []
        assert not any(again.name in line for line in slurm_nodes.steps()), slurm_nodes.steps()
    finally:
        slurm_nodes.run("scancel", job_id)
