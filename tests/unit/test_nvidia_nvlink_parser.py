"""``nvidia-smi nvlink -gt d|r`` captured with other sections around it: one reading per capture.

Files are real (tests/data/nvidia_smi/SOURCES.md); the seed is /work/shared/seeds/000_1990aeaee481215d.txt.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pytest_gpucluster.cli import main
from pytest_gpucluster.errors import ParseError
from pytest_gpucluster.parsers.nvidia_nvlink import LinkCounters, counter_delta, parse_nvlink_captures

DATA = Path(__file__).resolve().parents[1] / "data" / "nvidia_smi"
SEED = Path(__file__).resolve().parents[3] / "shared" / "seeds" / "000_1990aeaee481215d.txt"
IDLE_TRAINING = "nvlink_gt_idle_then_training_d_and_r_h800_llmaction.txt"


def read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def test_idle_and_training_captures_with_prose_between():
    """GPU behaviour: GPU 0 of an 8x H800 box read idle, then while training LLaMA-13B (``-gt d`` and
    ``-gt r``): three captures, labelled by the comment line before each; the training payload on link 0
    is ~1.39 TB more than idle."""
    idle, training, raw = parse_nvlink_captures(read(IDLE_TRAINING))
    assert [(c.report.kind, c.first, c.last) for c in (idle, training, raw)] == [
        ("data", 5, 21),
        ("data", 25, 41),
        ("raw", 43, 59),
    ]
    assert (idle.heading, training.heading, raw.heading) == (
        "# 未做任何操作时",
        "# 模型训练时（LLaMA-13B）",
        None,
    )
    assert idle.command == training.command == "nvidia-smi nvlink -i 0 -gt d"
    assert raw.command == "nvidia-smi nvlink -i 0 -gt r"
    assert idle.report.gpus["0"].links["0"] == LinkCounters(tx_kib=5863784, rx_kib=5863677)
    moved = counter_delta(idle.report, training.report)["0"]["0"]
    assert moved.tx_bytes == (1390774681 - 5863784) * 1024
    assert len(raw.report.gpus["0"].links) == 8


def test_start_and_end_snapshots_with_elisions():
    """GPU behaviour: a Slurm job's NVLink counters on V100 GPU 3 before and after a 4-GPU Keras run;
    ``...`` elides the other GPUs and links, ``start:``/``end:`` label the snapshots."""
    start, end = parse_nvlink_captures(read("nvlink_gt_d_v100_start_end_elided_aau.txt"))
    assert (start.heading, end.heading) == ("start:", "end:")  # Markdown fences label nothing
    assert list(start.report.gpus) == ["3"] and list(end.report.gpus) == ["3"]
    assert counter_delta(start.report, end.report)["3"]["0"].rx_bytes == (20904969 - 19255516) * 1024


@pytest.mark.skipif(not SEED.is_file(), reason=f"the seed file {SEED} is not beside this checkout")
def test_the_seed_file_whole_with_its_tables_and_prose():
    """The whole seed 000 (nvidia-smi tables, training logs, four nvlink readings) gives its four captures."""
    captures = parse_nvlink_captures(SEED.read_text(encoding="utf-8"))
    assert [(c.report.kind, len(c.report.gpus)) for c in captures] == [
        ("data", 1),
        ("raw", 1),
        ("data", 8),
        ("raw", 8),
    ]
    assert [c.command for c in captures] == [
        "nvidia-smi nvlink -i 0 -gt d",
        "nvidia-smi nvlink -i 0 -gt r",
        "nvidia-smi nvlink -gt d",
        "nvidia-smi nvlink -gt r",
    ]


def test_a_gpu_index_that_repeats_starts_a_new_capture():
    """GPU behaviour: the 8x H800 box read twice (all GPUs, then GPU 0). Variant: the two real readings
    pasted back to back with their prompt lines removed."""
    one = read("nvlink_gt_d_h800_8gpu.txt").splitlines()[1:]
    two = read("nvlink_gt_d_h800_gpu0.txt").splitlines()[1:]
    first, second = parse_nvlink_captures("\n".join([*one, *two]) + "\n")
    assert len(first.report.gpus) == 8 and list(second.report.gpus) == ["0"]
    assert second.first == len(one) + 1


def test_text_without_any_link_line_still_says_what_was_looked_for():
    """GPU behaviour: an L40S box (no NVLink) prints GPU lines and no link line: nothing to read."""
    with pytest.raises(ParseError, match=re.escape("no 'Link <n>: ...' line")):
        parse_nvlink_captures("GPU 0: NVIDIA L40S (UUID: GPU-0)\nsome prose\n")


def test_cli_prints_each_capture(capsys: pytest.CaptureFixture[str]):
    """``gpucluster parse nvlink`` on the idle/training file exits 0 and lists the three captures."""
    code = main(["parse", "nvlink", str(DATA / IDLE_TRAINING)])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [(c["kind"], c["lines"], c["heading"]) for c in out] == [
        ("data", [5, 21], "# 未做任何操作时"),
        ("data", [25, 41], "# 模型训练时（LLaMA-13B）"),
        ("raw", [43, 59], None),
    ]
    assert out[1]["gpus"]["0"]["links"]["7"] == {"tx_kib": 1391348007, "rx_kib": 1387855953}
