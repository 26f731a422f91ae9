"""Readiness verdicts (`checks.readiness`) on nodes whose probe readings are real recordings run
through the real parsers (`cluster.readiness.node_readiness`), and what the findings make of them:
the reason class, the rung and the fix, and a symptom that names its readiness cause."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pytest_gpucluster.checks.fail_closed import coverage
from pytest_gpucluster.checks.readiness import explainer, readiness_checks, readiness_preflight
from pytest_gpucluster.cluster.node_facts import ClusterFacts, NodeFacts
from pytest_gpucluster.cluster.readiness import node_readiness
from pytest_gpucluster.profiles.loader import load_profile
from pytest_gpucluster.profiles.physics import check_profile
from pytest_gpucluster.results.findings import findings_of
from pytest_gpucluster.results.model import Check, Measurement, ThresholdRef
from pytest_gpucluster.results.recorder import Recorder, ThresholdFailure

DATA = Path(__file__).parents[1] / "data"
H100_Q = (DATA / "nvidia_smi" / "ecc_q_h100x8_first2_535.161.08_gpud.txt").read_text()
HOST = "gpu-node-017"
LIMITS = "Max locked memory         {0}            {0}            bytes     \n"


def _lspci() -> str:
    with gzip.open(DATA / "readiness" / "lspci_vvv_hgx_h100_gpud.txt.gz", "rt") as handle:
        return handle.read()


def raw(**changes: object) -> dict:
    """A probe's readiness record of a ready HGX H100 node: real nvidia-smi -q and lspci -vvv."""
    record = {
        "smi_q": {"returncode": 0, "text": H100_Q},
        "fabric_manager": {"service": {"returncode": 0, "text": "active\n", "state": "active"},
                           "log": {"why": "/var/log/fabricmanager.log: permission denied (root, or read access to the file, is needed)"}},
        "kernel_log": {"source": "journalctl -k", "lines": []},
        "modules": {"nvidia_peermem": True, "nvidia": True, "kernel": "5.15.0-1053-nvidia",
                    "driver_version": "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Release Build"},
        "memlock": {"limits": LIMITS.format("unlimited")},
        "iommu": {"group_types": {"identity": 80}, "groups": 80, "cmdline": "iommu=pt"},
        "pci": {"devices": [{"bdf": "0000:83:00.0", "kind": "nvswitch"}]},
        "lspci": {"returncode": 0, "text": _lspci()},
        "dstate": {"stuck": {}},
    }  # fmt: skip
    record.update(changes)
    return record


def facts(**changes: object) -> ClusterFacts:
    node = NodeFacts(host=HOST, readiness=node_readiness(raw(**changes)))
    return ClusterFacts((node,), "test")


@pytest.fixture(scope="module")
def dgx():
    return load_profile("dgx-h100-ib").model


def _failed(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.failed]


def test_a_ready_node_passes_every_readiness_check(dgx):
    checks = readiness_checks(facts(), dgx)
    assert checks and not _failed(checks), [c.hint for c in _failed(checks)]
    assert {c.ref.key for c in checks if c.ref} >= {"readiness.fabric_manager", "readiness.acs_disabled",
                                                    "readiness.gpudirect_rdma", "readiness.min_memlock"}  # fmt: skip


def test_peermem_absent_with_the_proprietary_module_fails_with_its_fix_and_dma_buf_passes(dgx):
    modules = {"nvidia_peermem": False, "nvidia": True, "kernel": "5.15.0-1053-nvidia",
               "driver_version": "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Release Build"}  # fmt: skip
    [bad] = _failed(readiness_checks(facts(modules=modules), dgx))
    assert bad.metric == "readiness.gpudirect_rdma" and bad.labels == {"host": HOST}
    assert (
        bad.hint.startswith(f"{HOST}: nvidia_peermem not loaded, and no dma-buf path")
        and "load nvidia_peermem" in bad.hint
    )
    opened = modules | {
        "driver_version": "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.129.03"
    }
    assert not _failed(readiness_checks(facts(modules=opened), dgx))


def test_what_cannot_be_read_is_not_measured_naming_what_it_needs(dgx):
    denied = _lspci().replace("\tCapabilities: [", "\tCapabilities: <access denied>\n\tX [")
    checks = readiness_checks(facts(lspci={"returncode": 0, "text": denied}), dgx)
    [acs] = [c for c in checks if c.metric == "readiness.acs"]
    assert acs.problem == "not measured" and acs.failed
    assert "without root" in acs.hint and "readiness.acs_disabled" in acs.hint
    [memlock] = _failed(readiness_checks(facts(memlock={"limits": LIMITS.format("65536")}), dgx))
    assert "memlock limit 65536 bytes, profile wants unlimited" in memlock.hint


def test_fabric_manager_down_fails_the_node_and_every_gpu_with_start_fabric_manager(dgx):
    waiting = H100_Q.replace("Completed", "In Progress").replace("Success", "N/A")
    service = {"returncode": 3, "text": "inactive\n", "state": "inactive"}
    checks = readiness_checks(
        facts(smi_q={"returncode": 0, "text": waiting}, fabric_manager={"service": service, "log": {}}), dgx
    )
    failed = _failed(checks)
    assert [c.metric for c in failed] == ["readiness.fabric_manager", *["readiness.gpu_fabric_state"] * 2]
    assert (
        "0 of 2 GPUs joined the NVLink fabric" in failed[0].hint
        and "nvidia-fabricmanager is inactive" in failed[0].hint
    )
    assert all("start nvidia-fabricmanager" in c.hint for c in failed)


def test_no_nvswitch_and_no_fabric_state_needs_no_fabric_manager(dgx):
    pcie = H100_Q.replace("    Fabric\n        State                             : Completed\n"
                          "        Status                            : Success\n", "")  # fmt: skip
    checks = readiness_checks(facts(smi_q={"returncode": 0, "text": pcie}, pci={"devices": []},
                                    fabric_manager={"service": {"why": "'systemctl' is not on PATH"}}), dgx)  # fmt: skip
    [fm] = [c for c in checks if c.metric == "readiness.fabric_manager"]
    assert fm.ref == ThresholdRef(dgx.name, ("readiness", "fabric_manager"))
    assert fm.verdict == "pass" and "not needed" in fm.hint
    [sxid] = [c for c in checks if c.metric == "readiness.sxid_fatal"]
    assert sxid.ref is not None and sxid.verdict == "pass" and "no SXid to read" in sxid.hint
    # Judged under their keys, so fail-closed does not call them NOT MEASURED on a PCIe node (the
    # real H200 VM's quick tier did, before: profile.readiness.fabric_manager n/a NOT MEASURED).
    measured = _measured(checks, "acceptance/test_inventory.py::test_node_readiness")
    missing = [c.metric for c in coverage(dgx, measured, []).checks if "readiness" in c.metric]
    assert not [m for m in missing if "fabric_manager" in m or "sxid" in m], missing


def _measured(checks: list[Check], test_id: str) -> list[Measurement]:
    return [Measurement.of(c, test_id=test_id, time=0.0) for c in checks]


def test_the_finding_gives_the_fix_and_a_busbw_miss_names_gpudirect_off_as_its_cause(dgx):
    modules = {
        "nvidia_peermem": False,
        "nvidia": True,
        "kernel": "5.15.0",
        "driver_version": "NVRM version: NVIDIA UNIX x86_64 Kernel Module",
    }
    cluster = facts(modules=modules)
    ready = _measured(readiness_checks(cluster, dgx), "acceptance/test_inventory.py::test_node_readiness")
    busbw = Check("collectives.all_reduce.busbw", 180e9, "B/s", 370e9, ">=", ThresholdRef("dgx-h100-ib", ("collectives", "checks", 1, "min_busbw")),
                  scope="inter-node", labels={"size": 1 << 30})  # fmt: skip
    found = findings_of(
        [*ready, *_measured([busbw], "acceptance/test_collectives.py::test_collective")], hosts=[HOST]
    )
    by_metric = {f.metric: f for f in found}
    gdr = by_metric["readiness.gpudirect_rdma"]
    assert (gdr.reason, gdr.action, gdr.host) == ("node setup", "fix node setup", HOST)
    assert gdr.fix.startswith("load nvidia_peermem")
    symptom = by_metric["collectives.all_reduce.busbw"]
    assert symptom.cause.startswith(f"GPUDirect off on {HOST}: nvidia_peermem not loaded")
    assert "likely cause: GPUDirect off on gpu-node-017" in symptom.why and "likely cause" in symptom.line()
    assert json.loads(json.dumps(gdr.to_json()))["fix"] == gdr.fix
    # and the failed value's own message says it, as the test fails
    recorder = Recorder(Path("/nonexistent/results.json"), persist=False)
    recorder.explain = explainer(cluster, dgx)
    with pytest.raises(
        ThresholdFailure, match="Likely cause: GPUDirect off on gpu-node-017: nvidia_peermem not loaded"
    ):
        recorder.check_all([busbw])


def test_a_pending_row_remap_is_reset_gpu_on_that_gpu(dgx):
    pending = H100_Q.replace(
        "Pending                           : No\n        Remapping",
        "Pending                           : Yes\n        Remapping",
        1,
    )
    ready = _measured(readiness_checks(facts(smi_q={"returncode": 0, "text": pending}), dgx), "t")
    [f] = findings_of(ready, hosts=[HOST])
    assert (f.metric, f.gpu, f.reason, f.action) == (
        "readiness.row_remap_pending",
        "0 (00000000:19:00.0)",
        "hardware",
        "reset GPU",
    )
    assert f.fix.startswith("reset GPU to apply pending row remaps")


def test_readiness_failures_are_preflight_warnings_naming_node_and_fix(dgx):
    [w] = readiness_preflight(facts(memlock={"limits": LIMITS.format("8388608")}), dgx)
    assert w.severity == "warning" and w.host == HOST and w.requirement == "readiness.min_memlock"
    assert (
        w.message.startswith(f"{HOST}: memlock limit 8388608 bytes")
        and "raise the memlock limit" in w.message
    )


def test_facts_with_readiness_survive_json(dgx):
    cluster = facts()
    again = ClusterFacts.from_json(json.loads(json.dumps(cluster.to_json())))
    assert again == cluster and readiness_checks(again, dgx) == readiness_checks(cluster, dgx)


def test_profiles_check_refuses_fabric_manager_on_a_part_without_nvswitch():
    model = load_profile("h100-pcie").model
    broken = model.model_copy(
        update={
            "readiness": model.readiness.model_copy(update={"fabric_manager": True, "gpudirect_rdma": True})
        }
    )
    report = check_profile(broken)
    assert any("no NVSwitch for Fabric Manager to configure" in e.message for e in report.errors)
    assert any("names no ib, roce or efa" in w.message for w in report.warnings)


H200_VM = DATA / "readiness" / "h200_vm_2026_11_28"


def _captured(name: str) -> tuple[str, int]:
    """A file of benchmarks/gpu_capture_readiness.sh: ``$ command``, the output, ``[exit N]``."""
    lines = (H200_VM / name).read_text().splitlines()
    return "\n".join(lines[1:-1]) + "\n", int(lines[-1].strip("[]").split()[-1])


def test_the_real_h200_vm_is_ready_for_its_part_profile_and_names_what_a_site_profile_cannot_read():
    """The lead's GPU machine of 2026-11-28 (one H200 passed through to a VM, no NVSwitch, no
    systemctl or lspci in the image): Fabric State N/A, persistence on, no remap pending."""
    smi, _ = _captured("smi-q.txt")
    limits, _ = _captured("limits.txt")
    version, _ = _captured("driver-version.txt")
    [gpu] = node_readiness({"smi_q": {"returncode": 0, "text": smi}}).gpus
    assert (gpu.fabric_state, gpu.cluster_uuid, gpu.persistence, gpu.remap_pending) == (
        None,
        None,
        True,
        False,
    )
    remapper, _ = _captured("smi-row-remapper.txt")
    [only] = node_readiness({"smi_q": {"returncode": 0, "text": remapper}}).gpus
    assert (only.bus_id, only.remap_pending, only.remap_failure) == ("00000000:00:06.0", False, False)
    record = {
        "smi_q": {"returncode": 0, "text": smi},
        "fabric_manager": {"service": {"why": "'systemctl' is not on PATH"},
                           "log": {"why": "/var/log/fabricmanager.log: No such file or directory"}},
        "kernel_log": {"source": "dmesg", "lines": []},
        "modules": {"nvidia_peermem": False, "nvidia": True, "driver_version": version.strip(), "kernel": "6.1.0"},
        "memlock": {"limits": limits},
        "iommu": {"group_types": {}, "groups": 0, "cmdline": _captured("cmdline.txt")[0]},
        "pci": {"devices": [{"bdf": "0000:00:06.0", "kind": "gpu", "current_link_speed": "32.0 GT/s PCIe",
                             "max_link_speed": "32.0 GT/s PCIe", "current_link_width": "16", "max_link_width": "16"}]},
        "lspci": {"why": "'lspci' is not on PATH"},
        "dstate": {"stuck": {}},
    }  # fmt: skip
    ready = node_readiness(record)
    assert (ready.memlock, ready.iommu, ready.nvswitches, ready.open_module, ready.dmabuf) == (
        -1,
        "off",
        0,
        True,
        True,
    )
    cluster = ClusterFacts((NodeFacts(host="h200-vm", readiness=ready),), "test")
    part = readiness_checks(cluster, load_profile("h200-sxm").model)
    assert part and not _failed(part)
    assert {c.metric: c.verdict for c in part if "NVSwitch" in c.hint} == {
        "readiness.fabric_manager": "pass", "readiness.sxid_fatal": "pass", "readiness.nvlink_domain": "pass"
    }  # fmt: skip
    h200 = load_profile("h200-sxm").model
    measured = _measured(part, "acceptance/test_inventory.py::test_node_readiness")
    assert not [c for c in coverage(h200, measured, []).checks if "readiness" in c.metric]
    site = _failed(readiness_checks(cluster, load_profile("h200-spectrumx").model))
    assert [(c.metric, c.problem) for c in site] == [("readiness.acs", "not measured")]
    assert "'lspci' is not on PATH" in site[0].hint


def test_an_nvlink_miss_on_a_node_without_fabric_manager_names_it_and_a_version_miss_does_not(dgx):
    waiting = H100_Q.replace("Completed", "In Progress").replace("Success", "N/A")
    service = {"returncode": 3, "text": "inactive\n", "state": "inactive"}
    cluster = facts(smi_q={"returncode": 0, "text": waiting}, fabric_manager={"service": service, "log": {}})
    ready = _measured(readiness_checks(cluster, dgx), "acceptance/test_inventory.py::test_node_readiness")
    links = Check("nvlink.links_up", 0, "links", 18, ">=", ThresholdRef("dgx-h100-ib", ("nvlink", "links_per_gpu")),
                  labels={"host": HOST, "gpu": "0"})  # fmt: skip
    version = Check("nccl.version", 0, "bool", 1, "==", labels={"host": HOST})
    found = {f.metric: f for f in findings_of([*ready, *_measured([links, version], "t")], hosts=[HOST])}
    assert found["nvlink.links_up"].cause.startswith(
        f"NVLink fabric not configured on {HOST}: 0 of 2 GPUs joined"
    )
    assert "start nvidia-fabricmanager" in found["nvlink.links_up"].cause
    assert found["nccl.version"].cause is None
