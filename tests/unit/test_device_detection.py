"""Class 8 of issue 18: a GPU is matched to a part by its whole name, never a substring, and
--hw=auto picks the profile that names that exact part, saying which part it found."""

import csv
from pathlib import Path

import pytest

from pytest_gpucluster.errors import ProfileError
from pytest_gpucluster.profiles.detect import MachineInfo, choose_profile
from pytest_gpucluster.profiles.devices import identify_gpu, load_devices, resolve_gpu_model, same_part
from pytest_gpucluster.profiles.loader import known_profiles, load_profile

NAMES = Path(__file__).resolve().parents[1] / "data" / "gpu_names" / "names.csv"
ROWS = [row for row in csv.reader(NAMES.read_text().splitlines()) if row and not row[0].startswith("#")]


def machine(*names: str) -> MachineInfo:
    return MachineInfo(hostname="n1", cuda_available=True, gpu_names=names)


def shipped_models() -> list[tuple[str, str | None]]:
    return [(name, load_profile(name).model.cluster.gpu_model) for name in known_profiles()]


@pytest.mark.parametrize(("name", "part", "_"), ROWS, ids=[r[0] for r in ROWS])
def test_a_driver_name_is_exactly_one_part(name, part, _):
    device = identify_gpu(name)
    assert (device.key if device else "none") == part


@pytest.mark.parametrize(("name", "_", "profile"), ROWS, ids=[r[0] for r in ROWS])
def test_hw_auto_picks_the_profile_of_that_part_or_none(name, _, profile):
    if profile == "none":
        with pytest.raises(ProfileError, match="no profile names that part exactly") as exc:
            choose_profile(machine(name, name), shipped_models())
        assert repr(name) in str(exc.value)
        return
    chosen, reason = choose_profile(machine(name, name), shipped_models())
    assert chosen == profile
    part = identify_gpu(name)
    assert f"is {part.key} ({part.part}), the part {profile} names" in reason


def test_gh200_and_h100_pcie_say_which_part_they_are():
    with pytest.raises(ProfileError, match=r"'NVIDIA GH200 480GB' is gh200 \(GH200 Grace Hopper"):
        choose_profile(machine("NVIDIA GH200 480GB"), shipped_models())
    with pytest.raises(ProfileError, match=r"'NVIDIA H100 PCIe' is h100-pcie \(H100 PCIe\)") as exc:
        choose_profile(machine("NVIDIA H100 PCIe"), shipped_models())
    assert "dgx-h100-ib (H100 80GB HBM3)" in str(exc.value)  # the profiles and the parts they name
    assert "cluster.gpu_model: 'H100 PCIe'" in str(exc.value)  # how to write one for this GPU


def test_a_profile_naming_only_a_family_is_never_auto_selected():
    with pytest.raises(ProfileError, match="no profile names that part exactly"):
        choose_profile(machine("NVIDIA H100 80GB HBM3"), [("mine", "H100")])


def test_a_gpu_the_table_does_not_know_matches_a_profile_naming_it_exactly():
    chosen, reason = choose_profile(machine("NVIDIA B200"), [("b200", "B200"), ("h", "H100 80GB HBM3")])
    assert chosen == "b200" and "a part devices.yaml does not list" in reason


def test_mixed_parts_on_one_node_are_refused():
    with pytest.raises(ProfileError, match="mixes GPU parts"):
        choose_profile(machine("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"), shipped_models())


def test_without_cuda_auto_is_cpu_local():
    name, reason = choose_profile(MachineInfo(hostname="n1", cuda_available=False), shipped_models())
    assert name == "cpu-local" and reason.startswith("auto:")


@pytest.mark.parametrize(
    ("gpu_model", "device_name", "same"),
    [
        ("H200", "NVIDIA H200", True),
        ("H200", "NVIDIA GH200 480GB", False),
        ("H200", "NVIDIA H200 NVL", False),
        ("H100 80GB HBM3", "NVIDIA H100 PCIe", False),
        ("h100-sxm", "NVIDIA H100 80GB HBM3", True),
        ("A800-SXM4-80GB", "NVIDIA A800-SXM4-80GB", True),
        ("a800 sxm4 80gb", "NVIDIA A800-SXM4-80GB", True),
        ("H100", "NVIDIA H100 80GB HBM3", False),  # a family names no part
        ("H20", "NVIDIA H200", False),
    ],
)
def test_same_part(gpu_model, device_name, same):
    assert same_part(gpu_model, device_name) is same


def test_resolve_a_family_to_its_strongest_part_inexactly():
    match = resolve_gpu_model("H100")
    assert match.device.key == "h100-sxm" and not match.exact
    assert [d.key for d in match.candidates] == ["h100-sxm", "h100-pcie", "h100-nvl"]


def test_a_device_table_where_two_parts_share_a_name_is_refused(tmp_path):
    entry = "{{key: {key}, part: P, names: [{name}], peak_flops: 1TFLOP/s, memory: 1GiB, memory_bandwidth: 1GB/s, pcie_bandwidth: 1GB/s, source: s}}"
    bad = tmp_path / "devices.yaml"
    bad.write_text(
        "devices:\n  - "
        + entry.format(key="a", name="X 1")
        + "\n  - "
        + entry.format(key="b", name="x-1")
        + "\n"
    )
    with pytest.raises(ProfileError, match="'x-1' belongs to both a and b"):
        load_devices(bad)
