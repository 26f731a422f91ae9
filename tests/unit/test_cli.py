"""The gpucluster command end to end (in-process through cli.main)."""

import json
from pathlib import Path

import pytest

from pytest_gpucluster.cli import main

DATA = Path(__file__).resolve().parents[1] / "data"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_profiles_lists_every_shipped_profile_with_description(capsys):
    code, out, _ = run(capsys, "profiles")
    assert code == 0
    names = [line.split()[0] for line in out.splitlines()]
    assert {"cpu-local", "h200-spectrumx", "h800-ib", "a800-ib", "aws-g6e-efa", "dgx-h100-ib"} <= set(names)
    assert not any(name.startswith("_") for name in names)  # bases are for extends only
    assert all(len(line.split(maxsplit=1)) == 2 for line in out.splitlines())


def test_profiles_shows_resolved_profile(capsys):
    code, out, _ = run(capsys, "profiles", "h200-spectrumx", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["cluster"]["gpus_per_node"] == 8  # inherited through extends
    assert data["nccl_env"]["NCCL_IB_GID_INDEX"] == "3"


def test_unknown_profile_exit_2(capsys):
    code, _, err = run(capsys, "profiles", "nope")
    assert code == 2
    assert "Known profiles:" in err and "cpu-local" in err


@pytest.mark.parametrize(
    ("kind", "path", "key"),
    [
        ("nccl-tests", "nccl_tests/superbench_a100x8_all_reduce_error_column.log", "rows"),
        ("nccl-log", "nccl_logs/efa_libfabric_aws_ofi_2.27.3.log", "net_plugin"),
        ("nvlink", "nvidia_smi/nvlink_gt_d_h800_8gpu.txt", "gpus"),
    ],
)
def test_parse_prints_json(capsys, kind, path, key):
    code, out, _ = run(capsys, "parse", kind, str(DATA / path))
    assert code == 0
    data = json.loads(out)
    first = data[0] if isinstance(data, list) else data
    assert first[key]


def test_parse_without_data_is_exit_2_naming_the_file(capsys, tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_text("hello\nnothing to see\n")
    code, out, err = run(capsys, "parse", "nccl-tests", str(empty))
    assert code == 2 and out == ""
    assert "empty.log" in err


def test_parse_nodelist(capsys):
    code, out, _ = run(capsys, "parse", "nodelist", "node[001-003,010]")
    assert code == 0
    assert json.loads(out) == ["node001", "node002", "node003", "node010"]


def test_parse_hostfile_bad_line(capsys, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=8\nnode2 lots=8\n")
    code, _, err = run(capsys, "parse", "hostfile", str(hostfile))
    assert code == 2
    assert ":2:" in err and "lots" in err


@pytest.mark.parametrize(
    ("kind", "path", "check"),
    [
        (
            "ib-ports",
            "infiniband/ibstat_h100_roce_two_down_polling_gpud.txt",
            lambda d: (
                sorted(p["device"] for p in d["ib_ports"] if p["state"] == "DOWN") == ["mlx5_11", "mlx5_5"]
            ),
        ),
        (
            "ib-ports",
            "infiniband/ibv_devinfo_vv_cx6_hdr_second_port_disabled_ucx9908.txt",
            lambda d: [p["rate_gbps"] for p in d["ib_ports"]] == [200.0, None],
        ),
        (
            "ib-ports",
            "infiniband/sysfs_counters_for_loop_saturated_gpud943.txt",
            lambda d: d["ib_ports"][0]["counters"]["link_downed"] == 255,
        ),
        (
            "dcgm-diag",
            "dcgm/diag_4.2.3_gb10_software_fail.json",
            lambda d: d["failures"] == ["software: GPU 0"],
        ),
        (
            "dcgm-diag",
            "dcgm/diag_text_3.x_8gpu_gpu0_memory_fail_excerpt_mlengineering.txt",
            lambda d: d["failures"] == ["GPU Memory: GPU 0"],
        ),
        (
            "ecc",
            "nvidia_smi/ecc_q_rtx4090x8_disabled_first2_535.154.05_gpud.txt",
            lambda d: [(g["mode_current"], g["mode_pending"]) for g in d] == [(False, False)] * 2,
        ),
    ],
)
def test_parse_fabric_dcgm_and_ecc_kinds_print_json(capsys, kind, path, check):
    code, out, _ = run(capsys, "parse", kind, str(DATA / path))
    assert code == 0
    assert check(json.loads(out))


def test_parse_ib_ports_reads_a_fabric_probe_snapshot(capsys, tmp_path):
    from pytest_gpucluster.workloads.fabric_probe import snapshot

    path = tmp_path / "node7.json"
    path.write_text(json.dumps(snapshot(DATA / "infiniband" / "sysfs_h100_gpud", node="node7")))
    code, out, _ = run(capsys, "parse", "ib-ports", str(path))
    assert code == 0
    ports = json.loads(out)["ib_ports"]
    assert [(p["node"], p["device"], p["rate_gbps"]) for p in ports[:1]] == [("node7", "mlx5_0", 400.0)]


@pytest.mark.parametrize(
    ("kind", "text", "words"),
    [
        ("ib-ports", "no ports here\n", "not an ibstat"),
        ("ib-ports", "CA 'mlx5_0'\n\tCA type: MT4129\n", "no \"CA '<device>'\" block with a 'Port N:'"),
        ("dcgm-diag", '{"DCGM GPU Diagnostic": {"test_categories": [', "malformed JSON at line 1"),
        ("dcgm-diag", "Error: unable to connect to host engine\n", "no JSON object found"),
        ("ecc", "Driver Version : 535.161.08\n", "no 'ECC Mode' section"),
    ],
)
def test_parse_fabric_dcgm_and_ecc_without_usable_data_exit_2_naming_the_file(
    capsys, tmp_path, kind, text, words
):
    path = tmp_path / "recorded.txt"
    path.write_text(text)
    code, out, err = run(capsys, "parse", kind, str(path))
    assert code == 2 and out == ""
    assert str(path) in err and words in err
    assert "Traceback" not in err
