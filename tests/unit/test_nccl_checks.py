"""Profile nccl: expectations against real NCCL logs (tests/data/nccl_logs, see SOURCES.md there)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpucluster.checks.nccl import (
    agreement_check,
    check_agreement,
    check_expectation,
    check_profile,
    expectations_of,
    finding_checks,
    version_at_least,
    version_tuple,
)
from pytest_gpucluster.checks.nccl_logs import LogSet, read_logs
from pytest_gpucluster.errors import ParseError, ProfileError
from pytest_gpucluster.profiles.loader import load_profile
from pytest_gpucluster.profiles.schema import NcclSection
from pytest_gpucluster.results.model import ThresholdRef
from pytest_gpucluster.results.text import failure_message

LOGS = Path(__file__).resolve().parent.parent / "data" / "nccl_logs"
EFA = "efa_libfabric_aws_ofi_2.27.3.log"  # seed 003's rank-0 block: 4 ranks, aws-ofi-nccl 1.16.2
SOCKET_NO_PLUGIN = "plugin_missing_socket_2.21.5_nccl1653.log"


def logs(*names: str) -> LogSet:
    return read_logs([(name, (LOGS / name).read_text(encoding="utf-8")) for name in names])


def section(profile: str) -> NcclSection:
    nccl = load_profile(profile).model.nccl
    assert nccl is not None
    return nccl


def by_name(findings):
    return {f.expectation: f for f in findings}


@pytest.mark.parametrize(
    ("found", "minimum", "ok"),
    [
        ("2.27.3+cuda12.9", "2.21", True),
        ("2.19.3+cuda12.3", "2.21", False),
        ("2.21", "2.21.0", True),
        ("2.21.5", "2.21.10", False),  # numbers, not strings: 5 < 10
        ("2.3.7+cuda9.0", "2.21", False),
        ("v1.16.2-aws", "1.16", True),
        ("1.7.1aws", "1.16", False),
    ],
)
def test_versions_compare_by_their_numbers(found: str, minimum: str, ok: bool) -> None:
    assert version_at_least(found, minimum) is ok


def test_version_without_digits_is_refused() -> None:
    assert version_tuple("2.27.3+cuda12.9") == (2, 27, 3)
    assert version_tuple("master") is None
    with pytest.raises(ValueError, match="'master'"):
        version_at_least("master", "2.21")


def test_seed_log_meets_every_efa_expectation() -> None:
    run = logs(EFA)
    findings = check_profile(run.log, section("aws-g6e-efa"), run.quote)
    assert [(f.metric, f.found, f.ok) for f in findings] == [
        ("nccl.version", "2.27.3+cuda12.9", True),
        ("nccl.network", "Libfabric", True),
        ("nccl.net_plugin", "aws-ofi-nccl 1.16.2 (Libfabric)", True),
        ("nccl.net_plugin_version", "1.16.2", True),
        ("nccl.provider", "efa", True),
        ("nccl.gdr", "off", True),
    ]
    assert by_name(findings)["network"].evidence == f"{EFA}:81: " + (
        "llama-3-8b-node-0-0:194:724 [3] NCCL INFO Using network Libfabric"
    )


def test_seed_log_against_spectrum_x_names_network_plugin_and_gdr() -> None:
    run = logs(EFA)
    found = by_name(check_profile(run.log, section("h200-spectrumx"), run.quote))
    assert [name for name, f in found.items() if not f.ok] == ["network", "net_plugin", "gdr"]
    assert found["min_version"].ok
    network = found["network"]
    assert (network.expected, network.found) == ("IB", "Libfabric")
    assert network.evidence.endswith("NCCL INFO Using network Libfabric")
    plugin = found["net_plugin"]
    assert (plugin.expected, plugin.found) == ("none", "aws-ofi-nccl 1.16.2 (Libfabric)")
    assert (
        plugin.evidence
        == f"{EFA}:17: llama-3-8b-node-0-0:194:724 [3] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v10)"
    )
    assert "the log says" in plugin.message and "NCCL_NET_PLUGIN" in plugin.message


def test_socket_fallback_fails_efa_quoting_the_plugin_load_failure() -> None:
    run = logs(SOCKET_NO_PLUGIN)
    found = by_name(check_profile(run.log, section("aws-g6e-efa"), run.quote))
    assert (found["network"].found, found["network"].ok) == ("Socket", False)
    assert found["network"].evidence.endswith("NCCL INFO Using network Socket")
    plugin = found["net_plugin"]
    assert (plugin.found, plugin.ok, plugin.quoted) == ("none", False, True)
    assert "Plugin load returned 2 : libnccl-net.so: cannot open shared object file" in plugin.evidence
    assert found["min_version"].found == "2.21.5+cuda12.4" and not found["min_version"].ok
    provider = found["provider"]
    assert provider.found is None and not provider.quoted
    assert provider.because == "looked for 'NET/OFI Selected provider is <name>' and found no such line"


def test_internal_ib_with_gdrdma_meets_spectrum_x_but_its_nccl_is_too_old() -> None:
    run = logs("ib_gdrdma_2.7.6_nccl707.log")
    found = by_name(check_profile(run.log, section("h200-spectrumx"), run.quote))
    assert {name: f.ok for name, f in found.items()} == {
        "min_version": False,
        "network": True,
        "net_plugin": True,
        "gdr": True,
    }
    assert "No plugin found (libnccl-net.so), using internal implementation" in found["net_plugin"].evidence
    assert found["gdr"].evidence.endswith("via NET/IB/5/GDRDMA (a channel uses GDRDMA)")


def test_roce_counts_as_network_ib() -> None:
    run = logs("roce_2.19.3_nccl_tests185.log")
    [finding] = check_expectation(run.log, NcclSection(network="IB"), "network", run.quote)
    assert finding.ok and finding.found == "IB"


def test_network_names_across_plugin_releases() -> None:
    old_ofi = logs("efa_openmpi_aws_libfabric_ofi24.log")
    [finding] = check_expectation(old_ofi.log, NcclSection(network="Libfabric"), "network", old_ofi.quote)
    assert (finding.found, finding.ok) == ("AWS Libfabric", True)
    assert finding.evidence.endswith("via NET/AWS Libfabric/0 (from the channel lines)")
    hpcx = logs("nvls_ibext_sharp_2.24.3_nccl1584_stripped.log")
    [ibext] = check_expectation(hpcx.log, NcclSection(network="IBext"), "network", hpcx.quote)
    [ib] = check_expectation(hpcx.log, NcclSection(network="IB"), "network", hpcx.quote)
    assert (ibext.found, ibext.ok, ib.ok) == ("IBext_v8", True, False)


def test_no_plugin_expected_but_the_network_only_a_plugin_provides() -> None:
    run = logs("efa_openmpi_aws_libfabric_ofi24.log")  # the plugin's load line is not in this excerpt
    [finding] = check_expectation(run.log, NcclSection(net_plugin=None), "net_plugin", run.quote)
    assert not finding.ok
    assert finding.found == "a plugin providing network AWS Libfabric"


def test_plugin_expected_but_wrong_one_loaded() -> None:
    run = logs("socket_fallback_ibext_warn_nccl952.log")
    [finding] = check_expectation(
        run.log, NcclSection(net_plugin={"name": "aws-ofi-nccl"}), "net_plugin", run.quote
    )
    assert (finding.found, finding.ok) == ("nccl-rdma-sharp-plugins", False)
    assert finding.evidence.endswith("Plugin Path : /opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so")


def test_plugin_too_old() -> None:
    run = logs(EFA)
    wanted = NcclSection(net_plugin={"name": "aws-ofi-nccl", "min_version": "1.17"})
    name, version = check_expectation(run.log, wanted, "net_plugin", run.quote)
    assert name.ok and not version.ok
    assert (version.metric, version.expected, version.found) == (
        "nccl.net_plugin_version",
        "at least 1.17",
        "1.16.2",
    )


def test_nvls_on_and_off() -> None:
    on = logs("nvls_ibext_sharp_2.24.3_nccl1584_stripped.log")
    off = logs("socket_fallback_ibext_warn_nccl952.log")
    want = NcclSection(nvls=True)
    [yes] = check_expectation(on.log, want, "nvls", on.quote)
    [no] = check_expectation(off.log, want, "nvls", off.quote)
    assert (yes.ok, yes.found) == (True, "on")
    assert yes.evidence.endswith("NVLS multicast support is available on dev 0")
    assert (no.ok, no.found) == (False, "off")
    assert no.evidence.endswith("NVLS multicast support is not available on dev 4")


def test_a_log_that_never_names_its_network_says_what_was_looked_for() -> None:
    run = logs("ib_warn_completion_nccl1405.log")
    [finding] = check_expectation(run.log, NcclSection(network="IB"), "network", run.quote)
    assert finding.found is None and not finding.ok
    assert finding.evidence.startswith("looked for 'Using network <name>'")
    assert finding.evidence.endswith("and found no such line")


def test_explicit_null_plugin_is_an_expectation_and_unset_is_not() -> None:
    assert expectations_of(None) == ()
    assert expectations_of(NcclSection(network="IB")) == ("network",)
    assert expectations_of(NcclSection(network="IB", net_plugin=None)) == ("network", "net_plugin")
    assert expectations_of(section("aws-g6e-efa")) == (
        "min_version",
        "network",
        "net_plugin",
        "provider",
        "gdr",
    )


def test_bad_expectations_are_refused() -> None:
    run = logs(EFA)
    with pytest.raises(ValueError, match="unknown NCCL expectation 'netwrok'"):
        check_expectation(run.log, NcclSection(), "netwrok")
    with pytest.raises(ProfileError, match=r"nccl\.min_version 'latest'"):
        check_expectation(run.log, NcclSection(min_version="latest"), "min_version")


def test_ranks_of_one_log_agree() -> None:
    assert check_agreement(logs(EFA)) == []


def test_a_node_without_the_plugin_is_named_with_its_file_and_line() -> None:
    run = logs(EFA, SOCKET_NO_PLUGIN)
    assert len(run.sources) == 5
    found = by_name(check_agreement(run))
    assert set(found) == {"agreement.network", "agreement.cuda_driver_version", "agreement.net_plugin"}
    network = found["agreement.network"]
    assert network.found == "rank 0 (DESKTOP-1CE5APL:2852[0]) says 'Socket'"
    assert network.expected == "'Libfabric' on every rank (4 say so)"
    assert network.evidence == (
        f"{SOCKET_NO_PLUGIN}:9: DESKTOP-1CE5APL:2852:3596 [0] NCCL INFO Using network Socket"
    )
    plugin = found["agreement.net_plugin"]
    assert plugin.found == "rank 0 (DESKTOP-1CE5APL:2852[0]) loaded no plugin"
    assert (
        plugin.evidence.startswith(f"{SOCKET_NO_PLUGIN}:1: ") and "Plugin load returned 2" in plugin.evidence
    )
    # The joined log still holds the majority's facts, quoted at their own file and line.
    assert run.log.network.value == "Libfabric"
    assert run.quote(run.log.network.evidence).startswith(f"{EFA}:81: ")


def test_files_without_rank_prefixes_are_compared_file_by_file() -> None:
    stripped, info = (
        "nvls_ibext_sharp_2.24.3_nccl1584_stripped.log",
        "nvls_ibext_sharp_2.24.3_nccl1584_info.log",
    )
    same = logs(stripped, info)
    assert [name for name, _ in same.sources] == [stripped, info]
    assert check_agreement(same) == []
    mixed = logs("socket_forced_2.11.4_nccl676.log", stripped)
    [finding] = check_agreement(mixed)
    assert finding.expectation == "agreement.network"
    assert finding.found == f"rank 0 ({stripped}) says 'IBext_v8'"
    assert finding.evidence == f"{stripped}:16: Using network IBext_v8"


def test_line_numbers_map_back_to_each_file_even_after_a_cut_line() -> None:
    first = "host:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\nhost:1:1 [0] NCCL INFO Using net"  # cut
    second = (
        "other:2:2 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\nother:2:2 [0] NCCL INFO Using network IB\n"
    )
    run = read_logs([("a.log", first), ("b.log", second)])
    assert run.log.network.value == "IB"
    assert run.quote(run.log.network.evidence) == "b.log:2: other:2:2 [0] NCCL INFO Using network IB"


def test_a_file_with_no_nccl_line_is_named() -> None:
    with pytest.raises(ParseError, match=r"^notes\.txt: No NCCL debug output found"):
        read_logs([(EFA, (LOGS / EFA).read_text(encoding="utf-8")), ("notes.txt", "hello\nworld\n")])
    with pytest.raises(ParseError, match="no NCCL log"):
        read_logs([])


def test_probe_skips_without_nccl() -> None:
    from pytest_gpucluster.workloads._runtime import RankContext, WorkloadSkip
    from pytest_gpucluster.workloads.nccl_probe import probe

    ctx = RankContext(
        rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, host="h",
        device="cpu", backend="gloo", job_dir=Path("."),
    )  # fmt: skip
    with pytest.raises(WorkloadSkip, match="backend is gloo, not nccl"):
        probe(ctx)


def test_findings_are_checks_naming_their_profile_key() -> None:
    run = logs(EFA)
    findings = check_profile(run.log, section("h200-spectrumx"), run.quote)
    checks = finding_checks(findings, "h200-spectrumx", "--nccl-log seed", probe_nodes=None)
    network = next(c for c in checks if c.metric == "nccl.network")
    assert (network.value, network.threshold, network.comparison, network.failed) == (0.0, 1.0, "==", True)
    assert network.ref == ThresholdRef("h200-spectrumx", ("nccl", "network"))
    assert network.labels == {"expected": "IB", "found": "Libfabric"}
    assert failure_message(network).startswith(
        "nccl.network (expected=IB, found=Libfabric): measured no, expected exactly yes "
        "(threshold from profile h200-spectrumx: nccl.network). The log says "
    )
    assert "(logs from --nccl-log seed). Next: check that the RDMA stack" in network.hint
    efa = finding_checks(check_profile(run.log, section("aws-g6e-efa"), run.quote), "aws-g6e-efa", "x")
    plugin_version = next(c for c in efa if c.metric == "nccl.net_plugin_version")
    assert plugin_version.ref.key == "nccl.net_plugin.min_version" and not plugin_version.failed


def test_ranks_agreeing_or_not_is_one_check() -> None:
    agree = agreement_check(check_agreement(logs(EFA)), 4, "x")
    assert (agree.value, agree.failed, agree.labels["differ_on"]) == (1.0, False, "nothing")
