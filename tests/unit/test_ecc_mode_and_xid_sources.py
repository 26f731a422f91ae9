"""ECC mode in the per-GPU health (checks/burnin/gpu.py: NVML's answer or recorded ``nvidia-smi -q``
text) and the XID sources of workloads/_xid.py (journalctl, dmesg, syslog files, NVML events),
with the check that says when none could be read (checks/burnin/health.py).

Stand-ins answer with recorded real outputs (tests/data/kernel_logs, tests/data/nvidia_smi); each
test says which node behaviour it stands for."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_gpucluster.checks.burnin.gpu import ecc_mode_of, gpu_checks
from pytest_gpucluster.checks.burnin.health import (
    application_xids,
    counter_increases,
    xid_readability_checks,
    xid_warnings,
)
from pytest_gpucluster.profiles.schema import BurninSection
from pytest_gpucluster.workloads._xid import NvmlXidListener, kernel_xids, parse_xid_lines

DATA = Path(__file__).resolve().parents[1] / "data"
KERNEL = DATA / "kernel_logs"
SMI = DATA / "nvidia_smi"


def ecc_checks(value: dict) -> dict:
    return {
        c.metric: c
        for c in gpu_checks([value], BurninSection(), "h100")
        if c.metric.startswith("burnin.ecc_")
    }


def rank_value(nvml: dict, **extra) -> dict:
    base = {"pci_bus_id": "00000000:01:00.0", "gpu": "GPU 0 (00000000:01:00.0)"}
    return {"rank": 0, "local_rank": 0, "host": "node3", "nvml": base | nvml, **extra}


# ------------------------------------------------------------------------------- ECC mode


def test_ecc_enabled_and_staying_enabled_passes():
    checks = ecc_checks(rank_value({"ecc_mode": {"current": True, "pending": True}}))
    assert checks["burnin.ecc_enabled"].value == 1.0 and not checks["burnin.ecc_enabled"].failed
    assert checks["burnin.ecc_pending_change"].value == 0.0 and not checks["burnin.ecc_pending_change"].failed


def test_ecc_disabled_from_recorded_nvidia_smi_fails_naming_the_gpu():
    """An 8x RTX 4090 node (ECC Disabled/Disabled) where NVML gave no ECC mode: the rank's
    ``nvidia-smi -q -d ECC`` text is parsed, the block of its own bus id chosen."""
    text = (SMI / "ecc_q_rtx4090x8_disabled_first2_535.154.05_gpud.txt").read_text()
    checks = ecc_checks(rank_value({}, ecc_smi=text))
    enabled = checks["burnin.ecc_enabled"]
    assert enabled.failed and enabled.value == 0.0 and enabled.labels["gpu"] == "GPU 0 (00000000:01:00.0)"
    assert enabled.hint.startswith(
        "GPU 0 (00000000:01:00.0) of node3: ECC mode (disabled, from nvidia-smi -q -d ECC"
    )
    assert "nvidia-smi -i <gpu> -e 1" in enabled.hint
    assert not checks["burnin.ecc_pending_change"].failed  # disabled and staying disabled: one failure


def test_ecc_enabled_on_a_recorded_h100_passes():
    text = (SMI / "ecc_q_h100x8_first2_535.161.08_gpud.txt").read_text()
    bus = text.split("\nGPU ")[1].split()[0]
    value = {"rank": 0, "host": "h", "nvml": {"pci_bus_id": bus.lower(), "gpu": "GPU 0"}, "ecc_smi": text}
    current, pending, source = ecc_mode_of(value)
    assert (current, pending, source) == (True, True, "nvidia-smi -q -d ECC")


def test_a_pending_change_fails_even_while_ecc_is_on():
    """NVML: ECC on now, off after the next reset (no public recording of a pending change exists)."""
    checks = ecc_checks(rank_value({"ecc_mode": {"current": True, "pending": False}}))
    pending = checks["burnin.ecc_pending_change"]
    assert pending.failed and "current enabled, pending disabled, from NVML" in pending.hint
    assert not checks["burnin.ecc_enabled"].failed


def test_an_ecc_mode_nobody_could_read_is_not_a_pass():
    """A TITAN V (ECC Mode N/A in its recorded nvidia-smi -q), and a rank with neither NVML nor text."""
    titan = (SMI / "ecc_q_titanv_na_old_layout_560.35.03_gpud.txt").read_text()
    na = ecc_checks(rank_value({}, ecc_smi=titan))["burnin.ecc_enabled"]
    assert math.isnan(na.value) and na.failed and not na.measured
    none = ecc_checks(rank_value({}, skipped={"ecc_smi": "nvidia-smi -q -d ECC: not installed"}))
    assert "unknown (nvidia-smi -q -d ECC: not installed)" in none["burnin.ecc_enabled"].hint


# ------------------------------------------------------------------------------- XID sources


def answers(**by_command: tuple[int, str, str] | Exception):
    """A runner answering each command (by its program name) with (exit code, stdout, stderr)."""

    def run(argv):
        answer = by_command[argv[0]]
        if isinstance(answer, Exception):
            raise answer
        code, out, err = answer
        return subprocess.CompletedProcess(list(argv), code, out, err)

    return run


def no_files(path: str) -> str:
    raise PermissionError(13, "Permission denied", path)


def test_a_node_that_lets_no_log_be_read_says_why_for_each():
    """A non-root rank on Ubuntu: journalctl prints its permission hint (recorded), dmesg is
    restricted (recorded: exit 1), /var/log/kern.log is root:adm."""
    hint = (KERNEL / "journalctl_denied_hint_usernetes281.txt").read_text()
    denied = (KERNEL / "dmesg_restricted_osbuild_composer4094.txt").read_text()
    found = kernel_xids(answers(journalctl=(0, "", hint), dmesg=(1, "", denied)), no_files)
    assert found["events"] is None
    assert found["why"].startswith(
        "journalctl -k: Hint: You are currently not seeing messages from the system."
    )
    assert "dmesg: exit 1: dmesg: read kernel buffer failed: Operation not permitted" in found["why"]
    assert "/var/log/kern.log: Permission denied; /var/log/messages: Permission denied" in found["why"]


def test_a_journal_without_the_kernels_log_proves_nothing():
    """``No journal files were found`` (recorded), and a journal with no entry at all (a container)."""
    empty = (KERNEL / "journalctl_no_journal_files_coreos948.txt").read_text()
    found = kernel_xids(answers(journalctl=(0, "", empty), dmesg=FileNotFoundError()), no_files)
    assert (
        "journalctl -k: No journal files were found." in found["why"]
        and "dmesg: not installed" in found["why"]
    )
    found = kernel_xids(
        answers(journalctl=(0, "-- No entries --\n", ""), dmesg=FileNotFoundError()), no_files
    )
    assert "journalctl -k: no kernel message at all" in found["why"]


def test_the_first_readable_log_gives_the_events_and_names_itself():
    """Root on a systemd host: journalctl -k answers with journal-style kernel lines (recorded XID 45s)."""
    text = (KERNEL / "xid_45_four_gpus_journal_ogkm1150.log").read_text()
    found = kernel_xids(answers(journalctl=(0, text, ""), dmesg=AssertionError("not reached")), no_files)
    assert found["source"] == "journalctl -k" and [e["xid"] for e in found["events"]] == [45] * 8
    # dmesg denied, but a syslog file is readable (a user in group adm)
    log = (KERNEL / "xid_13_109_dmesg_ctime_gpud46.log").read_text()
    found = kernel_xids(answers(journalctl=FileNotFoundError(), dmesg=(1, "", "denied")), lambda path: log)
    assert found["source"] == "/var/log/kern.log" and [e["xid"] for e in found["events"]] == [13, 13, 13, 109]


@pytest.mark.parametrize(
    ("name", "events"),
    [
        ("xid_119_gsp_timeout_gpud_scan_gpud500.log", [("0000:9b:00", 119)] * 5),
        (
            "xid_145_149_gb200_pci_domain_gpud1174.log",
            [("0019:01:00", 149), ("0000:00:00", 149), ("0018:01:00", 145)],
        ),
    ],
)
def test_more_recorded_xid_lines(name, events):
    """A monitoring tool's quoted lines (XID 119, GSP timeouts) and GB200 lines with PCI domains."""
    assert [(e["pci"], e["xid"]) for e in parse_xid_lines((KERNEL / name).read_text())] == events


def test_an_xid_on_a_nonzero_pci_domain_is_matched_to_its_gpu():
    """GB200: the GPU at 0019:01:00 logs XID 149 during the run; NVML names it 00000019:01:00.0."""
    lines = (KERNEL / "xid_145_149_gb200_pci_domain_gpud1174.log").read_text()
    gpu = {
        "rank": 0,
        "host": "gb",
        "nvml": {"pci_bus_id": "00000019:01:00.0", "gpu": "GPU 0 (00000019:01:00.0)"},
    }
    before = [gpu | {"xid_events": []}]
    after = [gpu | {"xid_events": parse_xid_lines(lines)}]
    suspects = counter_increases(before, after)
    assert [(s.gpu, s.evidence["xid"], s.evidence["action"]) for s in suspects] == [
        ("GPU 0 (00000019:01:00.0)", 149, "reset GPU"),
        (
            "the GPU at PCI 0000:00:00",
            149,
            "reset GPU",
        ),  # not a GPU of this rank's node: named by its address
    ]
    # the 145 line (RLW_RXPIPE, errorStatus 0x00000008) decodes to IGNORE on the catalog's "XID 144-150
    # Decode" sheet: a recorded warning, the GPU not blamed (checks/burnin/xid_nvlink5.py)
    [warned] = application_xids(before, after)
    assert warned.labels["gpu"] == "the GPU at PCI 0018:01:00" and "RLW_RXPIPE" in warned.hint


def test_unreadable_xids_warn_with_the_fix_and_fail_only_where_the_profile_requires_a_source():
    readable = {"rank": 0, "host": "n1", "xid_events": [], "xid_source": "dmesg"}
    blind = {
        "rank": 0,
        "host": "n2",
        "user": "ci",
        "skipped": {"xid": "XID events not readable on n2: dmesg: exit 1: ..."},
    }
    checks = {c.labels["host"]: c for c in xid_readability_checks([readable, blind], [readable, blind])}
    assert checks["n1"].value == 1.0 and not checks["n1"].failed and "read from dmesg" in checks["n1"].hint
    assert math.isnan(checks["n2"].value) and not checks["n2"].failed and not checks["n2"].measured
    assert checks["n2"].hint.startswith(
        "XID events of n2 could not be checked: XID events not readable on n2"
    )
    assert (
        "Fix: sudo usermod -aG adm,systemd-journal ci  (or: sudo sysctl -w kernel.dmesg_restrict=0"
        in checks["n2"].hint
    )
    assert xid_warnings(list(checks.values())) == [checks["n2"].hint]
    strict = {
        c.labels["host"]: c
        for c in xid_readability_checks([readable, blind], [readable, blind], require=True, profile="p")
    }
    assert strict["n2"].failed and strict["n2"].problem == "not measured"
    assert str(strict["n2"].ref) == "profile p: burnin.require_xid_source"
    assert xid_warnings(list(strict.values())) == []


class FakeEvents:
    """pynvml's event API for one GPU with ``queued`` XIDs, then NVMLError_Timeout."""

    nvmlEventTypeXidCriticalError = 8

    class NVMLError_Timeout(Exception):
        pass

    def __init__(self, queued: list[int]) -> None:
        self.queued, self.freed, self.registered = list(queued), False, None

    def nvmlEventSetCreate(self):
        return "set"

    def nvmlDeviceRegisterEvents(self, handle, kinds, event_set):
        self.registered = kinds

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        if not self.queued:
            raise self.NVMLError_Timeout("Timeout")
        return SimpleNamespace(eventType=8, eventData=self.queued.pop(0))

    def nvmlEventSetFree(self, event_set):
        self.freed = True


def test_nvml_xid_events_during_the_load_are_drained():
    """Stands for NVML reporting XID 79 then 48 on the GPU while the health job loads it."""
    nvml = FakeEvents([79, 48])
    listener = NvmlXidListener(nvml, handle=object())
    assert listener.drain() == [{"xid": 79, "source": "nvml"}, {"xid": 48, "source": "nvml"}]
    assert listener.drain() == []
    listener.close()
    assert nvml.freed and nvml.registered == FakeEvents.nvmlEventTypeXidCriticalError
