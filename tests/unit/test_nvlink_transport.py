"""The NVLink speedup's two sides, checked from their NCCL logs (checks/nvlink_transport.py), and
the environments plans/nvlink.py gives them.

Every log here is a real ``NCCL_DEBUG=INFO`` recording (tests/data/nccl_logs/SOURCES.md). Each test
stands for what one rank log of a GPU speedup job would hold on an 8-GPU node."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pytest_gpucluster.checks.comparison import pair
from pytest_gpucluster.checks.nvlink import speedup_checks
from pytest_gpucluster.checks.nvlink_transport import (
    FAST_METRIC,
    SLOW_METRIC,
    SideLogs,
    transport_checks,
)
from pytest_gpucluster.plans.nvlink import NCCL_LOG, NVLINK_OFF, slow_side_env, speedup_parts
from pytest_gpucluster.profiles.loader import load_profile

LOGS = Path(__file__).parents[1] / "data" / "nccl_logs"
SHM_ONLY = "p2p_disabled_shm_gdr1_ring_vllm_2.28.9.log"  # NCCL_P2P_DISABLE=1: SHM channels only
P2P_CUMEM = "p2p_cumem_socket_2.28.9.log"  # the same two GPUs with P2P on
NVLS_USED = "nvls_used_gdrdma_2node_bracket_ts_k8s.log"  # NVLS set up, P2P/IPC and NET/IB/GDRDMA
MIB = 1 << 20


def side(name: str, *files: str, env: dict[str, str] | None = None, text: str | None = None) -> SideLogs:
    logs = [(f, (LOGS / f).read_text()) for f in files] if text is None else [("rank-0.log", text)]
    return SideLogs(name, env or {}, logs)


def by_metric(checks):
    return {c.metric: c for c in checks}


def test_a_slow_side_over_shm_and_a_fast_side_over_p2p_pass():
    """A healthy pair: the slow side (P2P disabled) shows only SHM channels, the fast side P2P/CUMEM.
    Stands for an H100 node's two speedup jobs; the recordings are of two RTX 5060 Ti, NCCL 2.28.9."""
    checks, untrusted = transport_checks(
        side("nccl-p2p", P2P_CUMEM, env=NCCL_LOG),
        side("nccl-nvlink-off", SHM_ONLY, env={**NCCL_LOG, **NVLINK_OFF}),
    )
    found = by_metric(checks)
    assert untrusted is None and not any(c.failed for c in checks)
    assert (found[FAST_METRIC].value, found[SLOW_METRIC].value) == (2.0, 0.0)
    assert found[SLOW_METRIC].labels == {
        "side": "nccl-nvlink-off",
        "env": "NCCL_MNNVL_ENABLE=0 NCCL_NVLS_ENABLE=0 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=0",
    }
    assert found[FAST_METRIC].labels["env"] == "the session's NCCL environment"
    assert (
        "via SHM/direct/direct" in found[SLOW_METRIC].hint and "NCCL_P2P_DISABLE=1" in found[SLOW_METRIC].hint
    )
    assert "via P2P/CUMEM" in found[FAST_METRIC].hint


def test_a_slow_side_over_p2p_fails_quoting_the_line_and_voids_the_speedup():
    """A P2P setting that did not take: the "slow" log holds P2P/CUMEM channels."""
    checks, untrusted = transport_checks(side("nccl-p2p", P2P_CUMEM), side("nccl-nvlink-off", P2P_CUMEM))
    slow = by_metric(checks)[SLOW_METRIC]
    assert slow.failed and slow.value == 2.0
    assert slow.hint.startswith(
        f"slow side still on NVLink: {P2P_CUMEM} line 32: proxmox:1417089:1417089 [1] NCCL INFO Channel 00/0 : "
        "1[2] -> 0[1] via P2P/CUMEM (and 1 more P2P/NVLS connection line(s))"
    )
    assert untrusted is not None and "P2P/CUMEM" in untrusted


def test_a_slow_side_with_nvls_is_still_on_nvlink():
    """P2P disabled but NVLS left on, the case NCCL_P2P_DISABLE=1 alone produces on an NVSwitch node.
    No real log of that exact combination was found; it is stood for by the NVLS lines of a real
    NVLS run (its P2P/IPC and NET lines removed), which is what such a run logs about NVLS."""
    text = "\n".join(
        line for line in (LOGS / NVLS_USED).read_text().splitlines() if "NVLS" in line or "nvls" in line
    )
    checks, untrusted = transport_checks(
        side("nccl-p2p", P2P_CUMEM), side("nccl-nvlink-off", text=text + "\n")
    )
    slow = by_metric(checks)[SLOW_METRIC]
    assert slow.failed
    assert (
        "slow side still on NVLink: rank-0.log line 1:" in slow.hint and "NVLS" in slow.hint.split("(and")[0]
    )
    assert untrusted is not None


def test_a_whole_nvls_run_as_the_slow_side_quotes_its_first_nvlink_line():
    """A real NVLS job log (8 GPUs per node, P2P/IPC inside the node) offered as the slow side."""
    checks, _ = transport_checks(side("nccl-p2p", P2P_CUMEM), side("nccl-nvlink-off", NVLS_USED))
    slow = by_metric(checks)[SLOW_METRIC]
    assert slow.failed and slow.value > 1
    assert f"{NVLS_USED} line 41:" in slow.hint and "via P2P/IPC" in slow.hint


def test_a_fast_side_without_p2p_fails_but_leaves_the_speedup_judged():
    """The fast side's log shows SHM only (no NVLink path found): a finding, not a void comparison."""
    checks, untrusted = transport_checks(side("nccl-p2p", SHM_ONLY), side("nccl-nvlink-off", SHM_ONLY))
    fast = by_metric(checks)[FAST_METRIC]
    assert fast.failed and fast.value == 0.0 and fast.threshold == 1.0
    assert fast.hint.startswith("fast side did not use NVLink: no P2P or NVLS connection, only SHM")
    assert untrusted is None


def test_logs_with_no_channel_line_cannot_verify_a_side():
    """A rank log with no NCCL line (NCCL_DEBUG overridden): not a pass, a check without a value."""
    checks, untrusted = transport_checks(
        side("nccl-p2p", P2P_CUMEM), side("nccl-nvlink-off", text="step 1 loss 2.3\nall done\n")
    )
    slow = by_metric(checks)[SLOW_METRIC]
    assert math.isnan(slow.value) and slow.failed and not slow.measured
    assert "hold no channel line" in slow.hint and untrusted is None


def test_an_untrusted_comparison_records_the_ratio_without_a_threshold():
    profile = load_profile("dgx-h100-ib").model
    comparison = pair(
        {16 * MIB: [300e9]}, {16 * MIB: [290e9]}, fast_name="nccl-p2p", slow_name="nccl-nvlink-off"
    )
    judged = [c for c in speedup_checks(profile, comparison, "advice") if c.metric == "nvlink.speedup"]
    assert judged[0].failed and judged[0].ref is not None
    void = [
        c
        for c in speedup_checks(profile, comparison, "advice", "slow side on NVLink")
        if c.metric == "nvlink.speedup"
    ]
    assert void[0].threshold is None and void[0].ref is None and not void[0].failed
    assert void[0].hint.startswith("Not judged: slow side on NVLink. ")


def test_the_slow_side_turns_off_every_nvlink_path_and_keeps_shm():
    profile = load_profile("dgx-h100-ib").model
    fast, slow = speedup_parts(profile)
    assert fast.options == slow.options and fast.key != slow.key
    assert fast.env == NCCL_LOG and NCCL_LOG["NCCL_DEBUG_FILE"] == ""
    assert slow.env == {**NCCL_LOG, **NVLINK_OFF}
    assert NVLINK_OFF["NCCL_P2P_DISABLE"] == "1" and NVLINK_OFF["NCCL_NVLS_ENABLE"] == "0"
    assert NVLINK_OFF["NCCL_SHM_DISABLE"] == "0"  # never pushed onto the network


@pytest.mark.parametrize(("algo", "forced"), [("NVLS", "Ring"), ("Ring,NVLS", None), (None, None)])
def test_an_nccl_algo_that_needs_nvls_gets_ring_on_the_slow_side(algo, forced):
    model = load_profile("dgx-h100-ib").model
    env = {**model.nccl_env, **({"NCCL_ALGO": algo} if algo else {})}
    model = model.model_copy(update={"nccl_env": env})
    assert slow_side_env(model).get("NCCL_ALGO") == forced
