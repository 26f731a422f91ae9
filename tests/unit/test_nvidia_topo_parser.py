"""``nvidia-smi topo -m`` with mangled tabs, wrapped lines, clipped pastes and other output around it.

Files are real captures (tests/data/nvidia_smi/SOURCES.md). Where a test needs a mangling no public paste
shows (a ``fold``-wrapped capture, tabs turned into single spaces, a legend deleted), it builds it in the
test from a real file and says how.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpucluster.parsers.nvidia_topo import Topology, parse_topo_text

DATA = Path(__file__).resolve().parents[1] / "data" / "nvidia_smi"


def read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def fold(text: str, width: int, *, at_blanks: bool) -> str:
    """What ``fold -w WIDTH`` (``-s``: break at blanks) does to a capture."""
    out = []
    for line in text.splitlines():
        while len(line) > width:
            cut = width
            if at_blanks and (blank := max(line.rfind(" ", 0, width), line.rfind("\t", 0, width))) > 0:
                cut = blank + 1
            out.append(line[:cut])
            line = line[cut:]
        out.append(line)
    return "\n".join(out) + "\n"


def affinities(topo: Topology) -> tuple[dict, dict, dict]:
    return topo.cpu_affinity, topo.numa_affinity, topo.gpu_numa_id


def test_tabs_with_a_doubled_tab_then_a_p2p_matrix():
    """GPU behaviour: 2x RTX 5090 on one Threadripper (PHB), tab-separated with an empty tab column before
    ``GPU NUMA ID``, followed in the same paste by ``nvidia-smi topo -p2p rw`` (GNS cells)."""
    topo = parse_topo_text(read("topo_2x5090_tabs_then_p2p_matrix_club3090.txt"))
    assert topo.gpus == ("GPU0", "GPU1") and topo.nics == ()
    assert topo.matrix == {"GPU0": {"GPU0": "X", "GPU1": "PHB"}, "GPU1": {"GPU0": "PHB", "GPU1": "X"}}
    assert affinities(topo) == (
        {"GPU0": "0-63", "GPU1": "0-63"},
        {"GPU0": "0", "GPU1": "0"},
        {"GPU0": None, "GPU1": None},
    )


def test_a_second_matrix_without_legend_between_does_not_overwrite_the_first():
    """GPU behaviour: the 2x RTX 5090 box above. Variant: the same paste with the first legend and the
    Markdown between the two matrices deleted, so the P2P matrix follows the topology at once."""
    lines = read("topo_2x5090_tabs_then_p2p_matrix_club3090.txt").splitlines()
    p2p = lines.index(" \tGPU0\tGPU1\t")
    topo = parse_topo_text("\n".join([*lines[:4], *lines[p2p:]]) + "\n")
    assert topo.matrix["GPU0"]["GPU1"] == "PHB"


def test_spaces_instead_of_tabs_nv8_nine_nics_paste_cut_in_the_last_row():
    """GPU behaviour: DGX A100 (NV8 between all GPUs, 9 NICs, two NUMA nodes) pasted into a GitHub issue,
    tabs rendered as spaces, no ``GPU NUMA ID`` column, the paste stopping inside GPU7's row."""
    topo = parse_topo_text(read("topo_a100_nv8_9nic_spaces_cut_nccl933.txt"))
    assert len(topo.nics) == 9
    assert topo.matrix["GPU4"]["NIC1"] == "PIX"
    assert topo.cpu_affinity["GPU3"] == "0-47,96-143" and topo.numa_affinity["GPU3"] == "0"
    assert topo.cpu_affinity["GPU4"] == "48-95,144-191" and topo.numa_affinity["GPU4"] == "1"
    assert "GPU7" not in topo.cpu_affinity  # the row stops after four cells
    assert topo.matrix["GPU7"]["GPU3"] is None  # GPU7's last printed cell may be cut: not read
    assert topo.matrix["GPU7"]["GPU2"] == "NV8"
    assert topo.gpu_numa_id == {}


def test_three_numa_nodes_and_gpu_numa_id():
    """GPU behaviour: an 8x H100 (NV18) host whose GPUs sit on NUMA nodes 0, 1 and 2 (GPU3 alone on 1)."""
    topo = parse_topo_text(read("topo_h100_nv18_9nic_numa3_cut_sglang13973.txt"))
    assert topo.numa_affinity == {
        "GPU0": "0",
        "GPU1": "0",
        "GPU2": "0",
        "GPU3": "1",
        "GPU4": "2",
        "GPU5": "2",
    }
    assert topo.cpu_affinity["GPU3"] == "24-47,120-143"
    assert set(topo.gpu_numa_id.values()) == {None}
    assert topo.matrix["GPU3"]["NIC4"] == "PIX"


def test_misaligned_columns_after_a_prompt_and_a_row_cut_mid_cell():
    """GPU behaviour: ``nvidia-smi topo -mp`` on an 8-GPU, 14-NIC PCIe node: one column one blank wider
    than the others, the prompt line above, and the paste stopping at ``SY``."""
    topo = parse_topo_text(read("topo_mp_14nic_misaligned_prompt_cut_deepep60.txt"))
    assert topo.nics == tuple(f"NIC{i}" for i in range(14))
    assert topo.matrix["GPU0"]["NIC11"] == "SYS" and topo.matrix["GPU3"]["NIC7"] == "PIX"
    assert affinities(topo)[0] == {f"GPU{i}": "0-47,96-143" for i in range(4)}
    assert topo.gpu_numa_id == {f"GPU{i}": None for i in range(4)}
    assert topo.matrix["GPU4"]["NIC6"] == "SYS" and topo.matrix["GPU4"]["NIC7"] is None  # "SY" was cut


def test_old_driver_padded_to_terminal_width_with_a_mellanox_column():
    """GPU behaviour: a 2017 8-GPU PCIe box (PIX/PHB/SYS, one ``mlx4_0`` HCA), every line padded with
    blanks to the terminal width, CPU Affinity the only trailing column."""
    topo = parse_topo_text(read("topo_8gpu_mlx4_padded_cut_k8s53497.txt"))
    assert topo.nics == ("mlx4_0",) and topo.nic_names == {"mlx4_0": "mlx4_0"}
    assert topo.matrix["GPU2"]["mlx4_0"] == "PHB"
    assert topo.cpu_affinity == {f"GPU{i}": "0-9,20-29" for i in range(4)}  # GPU4's value ends the cut paste
    assert topo.numa_affinity == {}


@pytest.mark.parametrize("width", [60, 80, 132])
@pytest.mark.parametrize(
    "name", ["topo_dgx_h100_13nic.txt", "topo_a100_8gpu_17nic.txt", "topo_rtx4090_8gpu_tabs.txt"]
)
@pytest.mark.parametrize("at_blanks", [True, False], ids=["fold-s", "fold-hard"])
def test_wrapped_capture_reads_as_the_unwrapped_one(name: str, width: int, at_blanks: bool):
    """GPU behaviour: DGX H100, 8x A100 with 17 NICs, 8x RTX 4090. Variant: each capture passed through
    ``fold`` (``-s`` breaks at blanks; hard breaks cut values in two), header included. Every cell and
    every affinity field is what the unwrapped capture gives."""
    whole = parse_topo_text(read(name))
    wrapped = parse_topo_text(fold(read(name), width, at_blanks=at_blanks))
    assert wrapped.gpus == whole.gpus and wrapped.nics == whole.nics
    assert affinities(wrapped) == affinities(whole)
    assert wrapped.matrix == whole.matrix


def test_tabs_turned_into_single_spaces():
    """GPU behaviour: an 8x RTX 4090 box on two NUMA nodes. Variant: its tab-separated capture with
    every tab replaced by one blank."""
    text = read("topo_rtx4090_8gpu_tabs.txt")
    assert "\t" in text
    whole, spaced = parse_topo_text(text), parse_topo_text(text.replace("\t", " "))
    assert affinities(spaced) == affinities(whole)
    assert spaced.cpu_affinity["GPU4"] == "56-111,168-223" and spaced.numa_affinity["GPU4"] == "1"
    assert spaced.matrix == whole.matrix


def test_legend_absent():
    """GPU behaviour: a DGX H100 (NV18, 13 NICs). Variant: its capture with everything from
    ``Legend:`` on deleted."""
    lines = read("topo_dgx_h100_13nic.txt").splitlines()
    topo = parse_topo_text("\n".join(lines[: lines.index("Legend:")]) + "\n")
    assert topo.nic_names == {} and len(topo.nics) == 13
    assert topo.cpu_affinity["GPU7"] == "56-111,168-223" and topo.numa_affinity["GPU7"] == "1"
