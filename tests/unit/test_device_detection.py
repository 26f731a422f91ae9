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
def test_hw_auto_picks_the_part_profile_of_that_part_or_none(name, _, profile):
    if profile == "none":
        with pytest.raises(ProfileError, match="no part profile describes it") as exc:
            choose_profile(machine(name, name), shipped_models())
        assert repr(name) in str(exc.value)
        return
    chosen, reason = choose_profile(machine(name, name), shipped_models())
    assert chosen == profile
    part = identify_gpu(name)
    assert f"is {part.key} ({part.part}): its part profile {profile}" in reason


def test_every_device_has_a_part_profile_and_auto_never_picks_a_site_profile():
    parts = {d.key for d in load_devices()}
    assert parts <= set(known_profiles())
    for name in ("h200-spectrumx", "dgx-h100-ib", "h800-ib", "a800-ib", "aws-g6e-efa"):
        assert load_profile(name).model.extends in parts, name  # a site profile extends a part


def test_gh200_and_h100_pcie_get_their_own_part_not_the_sxm_one():
    assert choose_profile(machine("NVIDIA GH200 480GB"), shipped_models())[0] == "gh200"
    assert choose_profile(machine("NVIDIA H100 PCIe"), shipped_models())[0] == "h100-pcie"


def test_a_missing_part_profile_is_named():
    with pytest.raises(
        ProfileError, match=r"'NVIDIA H200' is h200-sxm \(H200 SXM\), but no part profile h200-sxm.yaml"
    ):
        choose_profile(machine("NVIDIA H200"), [("h200-spectrumx", "H200")])


def test_a_gpu_the_table_does_not_know_matches_a_profile_naming_it_exactly():
    chosen, reason = choose_profile(machine("NVIDIA L20"), [("l20", "L20"), ("h", "H100 80GB HBM3")])
    assert chosen == "l20" and "a part devices.yaml does not list" in reason


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
