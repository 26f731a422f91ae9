"""Physics checks at profile load: implied MFU, link ceilings, memory, efficiency; the device table."""

from pathlib import Path

import pytest

from pytest_gpucluster.errors import ProfileError
from pytest_gpucluster.profiles.devices import find_device, load_devices
from pytest_gpucluster.profiles.loader import known_profiles, load_profile, shipped_thresholds_dir
from pytest_gpucluster.profiles.physics import busbw_ceiling, check_profile, implied_mfu, peaks_for
from pytest_gpucluster.profiles.schema import ProfileModel

SHIPPED = shipped_thresholds_dir()


def _copy(tmp_path: Path, shipped: str, old: str, new: str, name: str = "copy") -> Path:
    """A copy of a shipped profile with one text replacement (which must apply exactly once)."""
    text = (SHIPPED / f"{shipped}.yaml").read_text()
    assert text.count(old) == 1, f"{old!r} not found once in {shipped}.yaml"
    path = tmp_path / f"{name}.yaml"
    path.write_text(text.replace(old, new))
    return path


# --------------------------------------------------------------------------------------------
# Must show: seed 002's 7B throughput, and 1000 GB/s of busbw inside one 8 x H100 node
# --------------------------------------------------------------------------------------------


def test_seed_002_throughput_as_a_threshold_is_refused_with_its_implied_mfu(tmp_path):
    # Seed 002 "expects" 15,234.5 samples/s for Llama-2-7B on 2 nodes x 8 H200. It gives no
    # sequence length; 32 tokens per sample is far below any real Alpaca prompt + response (and
    # below the 2048 its own recipe uses), so an MFU above 100% at 32 is above 100% at any length.
    path = _copy(
        tmp_path,
        "h200-spectrumx",
        "      seq_len: 2048\n",
        "      seq_len: 32\n      min_samples_per_s: 15234.5\n",
    )
    with pytest.raises(ProfileError) as exc:
        load_profile(str(path))
    message = str(exc.value)
    assert "copy.yaml, line" in message
    assert "sft.cases[0].min_samples_per_s" in message
    assert "15,234.5 samples/s x 32 tokens / 16 GPUs = 30,469 tokens/s per GPU" in message
    assert "39.69 GFLOP/token (llama2-7b at seq_len 32" in message
    assert "1,209 TFLOP/s per GPU" in message
    assert "989 TFLOP/s dense peak (cluster.peak_flops) = 122% MFU" in message


def test_seed_002_throughput_at_the_profiles_own_seq_len_is_far_beyond_the_peak(tmp_path):
    path = _copy(
        tmp_path,
        "h200-spectrumx",
        "      seq_len: 2048\n",
        "      seq_len: 2048\n      min_samples_per_s: 15234.5\n",
    )
    with pytest.raises(ProfileError, match=r"implies 8,4[0-9]{2}% MFU"):
        load_profile(str(path))


def test_1000_gbs_busbw_inside_an_8xh100_node_is_refused_with_the_link_arithmetic(tmp_path):
    path = _copy(tmp_path, "dgx-h100-ib", "min_busbw: 460GB/s", "min_busbw: 1000GB/s")
    with pytest.raises(ProfileError) as exc:
        load_profile(str(path))
    message = str(exc.value)
    assert "collectives.checks[0].min_busbw" in message
    assert "min_busbw 1,000 GB/s (all_reduce, intra-node) is more than the links can carry" in message
    assert (
        "450 GB/s (NVLink per direction, cluster.nvlink_bandwidth) x 2(n-1)/n = 1.75 (n = 8 ranks)" in message
    )
    assert "= 787.5 GB/s" in message  # NVLS (in-switch reduction) allowed: 450 x 1.75 / 1
    assert "without which the ceiling is 450 GB/s" in message
    assert "1,000 GB/s > 787.5 GB/s" in message


def test_without_nvls_the_intra_node_ceiling_is_the_link_itself(tmp_path):
    # 460 GB/s (Azure's H100 floor) needs NVLink SHARP; a profile that turns NVLS off cannot ask for it.
    path = _copy(tmp_path, "dgx-h100-ib", "  gdr: true\n", "  gdr: true\n  nvls: false\n")
    with pytest.raises(
        ProfileError, match=r"= 450 GB/s; inside one node busbw is normalised.*460 GB/s > 450 GB/s"
    ):
        load_profile(str(path))


# --------------------------------------------------------------------------------------------
# Link ceilings, by hand
# --------------------------------------------------------------------------------------------


def _model(**cluster) -> ProfileModel:
    base = {"gpus_per_node": 8, "device": "cuda", "gpu_model": "H100"}
    return ProfileModel.model_validate({"name": "t", "description": "t", "cluster": {**base, **cluster}})


@pytest.mark.parametrize(
    "collective", ["all_gather", "reduce_scatter", "alltoall", "broadcast", "reduce", "sendrecv"]
)
def test_intra_node_ceiling_is_the_per_direction_link_for_every_collective(collective):
    model = _model()
    ceiling = busbw_ceiling(collective, "intra-node", model, peaks_for(model))
    assert ceiling.value == pytest.approx(450e9)  # devices.yaml h100-sxm: 900 GB/s bidirectional


def test_inter_node_all_reduce_ceiling_counts_the_intra_node_reduction():
    # 2 nodes x 8 GPUs, 8 x 400 Gb/s NICs = 400 GB/s per node. Per node, a 2-node all_reduce
    # must move 2(U-1)/U = 1 message; busbw = algbw x 2(16-1)/16 = 1.875 -> 750 GB/s.
    model = _model(nodes=2, nics_per_node=8, nic_line_rate="400Gbps")
    ceiling = busbw_ceiling("all_reduce", "inter-node", model, peaks_for(model))
    assert ceiling.value == pytest.approx(750e9)
    assert "8 NICs x 400 Gb/s" in ceiling.arithmetic and "1.875 (n = 16 ranks)" in ceiling.arithmetic
    # AWS measures 487 GB/s all_reduce busbw between two p5 (400 GB/s of EFA each): below this
    # ceiling, above the naive NIC x NICs = 400 GB/s one.
    assert ceiling.value > 487e9


def test_inter_node_ceilings_of_the_other_collectives():
    model = _model(nodes=4, nics_per_node=8, nic_line_rate="400Gbps")
    peaks = peaks_for(model)
    # full scope: U = 4 nodes, n = 32 ranks, r = 8 per node, B = 400 GB/s
    assert busbw_ceiling("all_gather", "full", model, peaks).value == pytest.approx(
        400e9 * (31 / 32) / (3 / 4)
    )
    assert busbw_ceiling("alltoall", "full", model, peaks).value == pytest.approx(
        400e9 * (31 / 32) / (8 * 3 / 4)
    )
    assert busbw_ceiling("broadcast", "full", model, peaks).value == pytest.approx(400e9)
    assert busbw_ceiling("all_reduce", "full", model, peaks).value == pytest.approx(
        400e9 * (62 / 32) / (6 / 4)
    )


def test_collnet_allows_in_network_reduction_across_nodes():
    model = _model(nodes=2, nics_per_node=8, nic_line_rate="400Gbps")
    model = model.model_copy(update={"nccl_env": {"NCCL_COLLNET_ENABLE": "1"}})
    ceiling = busbw_ceiling("all_reduce", "inter-node", model, peaks_for(model))
    assert ceiling.value == pytest.approx(400e9 * 1.875)


def test_unknown_links_are_skipped_with_a_reason_not_guessed():
    model = _model(gpu_model="L20", nodes=2)  # not in devices.yaml; no NIC figures
    assert "no per-GPU link bandwidth" in busbw_ceiling("all_reduce", "intra-node", model, peaks_for(model))
    assert "no network figures" in busbw_ceiling("all_reduce", "inter-node", model, peaks_for(model))


def test_pcie_is_the_intra_node_ceiling_without_nvlink(tmp_path):
    model = _model(gpu_model="L40S", gpus_per_node=4)
    ceiling = busbw_ceiling("all_reduce", "intra-node", model, peaks_for(model))
    assert ceiling.value == pytest.approx(32e9) and "PCIe" in ceiling.arithmetic


# --------------------------------------------------------------------------------------------
# MFU, memory, fractions, efficiency
# --------------------------------------------------------------------------------------------


def test_seed_001_throughput_implies_the_mfu_it_reports():
    h800 = load_profile("h800-ib").model
    case = h800.sft.cases[1]  # llama2-70b, 32 GPUs, seq_len 4096
    mfu, text = implied_mfu(
        case, "min_tokens_per_s_per_gpu", 791.37, h800.cluster, peaks_for(h800).peak_flops
    )
    # Seed 001 prints 33.6% with 6N, N = 70e9; PaLM's 6N + 12LHQT with N = 68.7e9 gives 35.6%.
    assert mfu == pytest.approx(0.356, abs=0.002)
    assert "444.5 GFLOP/token" in text


def test_high_but_possible_mfu_is_a_warning_that_reaches_the_loaded_profile(tmp_path):
    # llama2-70b on 32 H800: 1,500 tokens/s per GPU x 444.5 GFLOP/token = 667 TFLOP/s = 67% of 989.
    path = _copy(tmp_path, "h800-ib", "      min_mfu: 20%\n", "      min_tokens_per_s_per_gpu: 1500\n")
    profile = load_profile(str(path))
    [warning] = profile.warnings
    assert "copy.yaml, line" in warning and "sft.cases[1].min_tokens_per_s_per_gpu" in warning
    assert "implies 67.4% MFU, above 60%" in warning


def test_max_step_time_is_a_throughput_threshold_too(tmp_path):
    # llama-13b on 8 H800, 2 x 4 x 512 tokens per GPU per step in 0.1 s = 40,960 tokens/s per GPU.
    path = _copy(tmp_path, "h800-ib", "max_step_time: 8.6s", "max_step_time: 0.1s")
    with pytest.raises(
        ProfileError, match=r"max_step_time 0.1 s implies [0-9,]+% MFU.*2 x 4 x 512 tokens per GPU per step"
    ):
        load_profile(str(path))


def test_min_mfu_above_100_percent_is_an_error(tmp_path):
    path = _copy(tmp_path, "h800-ib", "min_mfu: 20%", "min_mfu: 105%")
    with pytest.raises(ProfileError, match=r"sft.cases\[1\].min_mfu': min_mfu 105% is above 100%"):
        load_profile(str(path))


def test_memory_ceiling_above_the_device_is_an_error(tmp_path):
    path = _copy(tmp_path, "h800-ib", "max_peak_memory: 72GB", "max_peak_memory: 90GiB")
    with pytest.raises(ProfileError) as exc:
        load_profile(str(path))
    assert (
        "max_peak_memory 90 GiB (96.64 GB) is above the device memory 80 GiB (85.9 GB) (cluster.gpu_memory)"
        in str(exc.value)
    )


def test_memory_ceiling_at_the_binary_capacity_is_allowed():
    # h800-ib gates llama2-70b at 80GiB while its cluster.gpu_memory says "80GB" (80e9 bytes):
    # the datasheet's 80GB is 80 GiB, so the larger stated capacity is the one held against.
    profile = load_profile("h800-ib")
    assert profile.model.sft.cases[1].max_peak_memory == 80 * 2**30
    assert peaks_for(profile.model).memory.value == 80 * 2**30


def test_scaling_efficiency_above_100_percent_is_an_error(tmp_path):
    path = _copy(tmp_path, "h200-spectrumx", "min_efficiency: 93%", "min_efficiency: 103%")
    with pytest.raises(
        ProfileError,
        match=r"scaling.steps\[1\].min_efficiency': min_efficiency 103% from 4 to 8 nodes is above 100%",
    ):
        load_profile(str(path))


def test_gpu_util_above_100_percent_is_an_error(tmp_path):
    path = _copy(tmp_path, "h200-spectrumx", "min_gpu_util: 90%", "min_gpu_util: 1.2")
    with pytest.raises(ProfileError, match="min_gpu_util 120% is above 100%"):
        load_profile(str(path))


@pytest.mark.parametrize(
    ("burnin", "error"),
    [
        (
            "{min_matmul: 1200TFLOP/s}",
            "min_matmul 1,200 TFLOP/s per GPU is above the dense bf16 peak, 989 TFLOP/s",
        ),
        (
            "{min_memory_bandwidth: 4TB/s}",
            "above the memory bandwidth, 3,350 GB/s (cluster.memory_bandwidth)",
        ),
        (
            "{min_h2d_bandwidth: 100GB/s}",
            "above the host link, 64 GB/s (PCIe x16 per direction, devices.yaml h100-sxm)",
        ),
        ("{pair_min_busbw: 800GB/s}", "800 GB/s > 750 GB/s"),
        ("{min_matmul: 700TFLOP/s, min_memory_bandwidth: 3TB/s, pair_min_busbw: 380GB/s}", None),
    ],
)
def test_burnin_floors_against_the_device(tmp_path, burnin, error):
    path = _copy(tmp_path, "dgx-h100-ib", "\nnccl:\n", f"\nburnin: {burnin}\n\nnccl:\n")
    if error is None:
        assert load_profile(str(path)).warnings == ()
        return
    with pytest.raises(ProfileError) as exc:
        load_profile(str(path))
    assert error in str(exc.value) and "key 'burnin." in str(exc.value)


def test_errors_and_warnings_name_the_file_that_holds_the_key(tmp_path):
    # the child sets only the threshold; the message points at the child's line, not the parent's
    (tmp_path / "child.yaml").write_text(
        "name: child\ndescription: d\nextends: dgx-h100-ib\ncollectives:\n  checks:\n"
        "    - {collective: all_gather, scope: intra-node, size: 1GiB, min_busbw: 500GB/s}\n"
    )
    with pytest.raises(
        ProfileError,
        match=r"child.yaml, line 6, key 'collectives.checks\[0\].min_busbw'.*500 GB/s > 450 GB/s",
    ):
        load_profile(str(tmp_path / "child.yaml"))


# --------------------------------------------------------------------------------------------
# Shipped profiles and the device table
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(known_profiles()))
def test_every_shipped_profile_passes_the_physics_checks(name):
    profile = load_profile(name)
    report = check_profile(profile.model)
    assert report.errors == () and profile.warnings == ()


def test_gpu_profiles_are_actually_checked():
    checked = {name: check_profile(load_profile(name).model).checked for name in known_profiles()}
    assert checked["dgx-h100-ib"] >= 2 and checked["h800-ib"] >= 5 and checked["h200-spectrumx"] >= 4
    # nothing to hold a CPU's gloo bandwidth against: skipped, saying why
    skipped = check_profile(load_profile("cpu-local").model).skipped
    assert any(s.startswith("collectives.checks[0].min_busbw") and "a CPU profile" in s for s in skipped)


def test_device_table_matches_the_reference_figures():
    # shared/REFERENCE-FIGURES.md, "Device peaks": dense TFLOP/s, memory, NVLink bidirectional.
    expected = {
        "h100-sxm": (989, 80, 900),
        "h200-sxm": (989, 141, 900),
        "h800-sxm": (989, 80, 400),
        "a100-sxm-80gb": (312, 80, 600),
        "a800-sxm-80gb": (312, 80, 400),
        "l40s": (362, 48, None),
        # other Hopper form factors (datasheets; not in REFERENCE-FIGURES): their own parts
        "h100-pcie": (756, 80, 600),
        "h100-nvl": (835, 94, 600),
        "h200-nvl": (835, 141, 900),
        "gh200": (989, 96, 900),
        # Blackwell (GB200 NVL72 technical specifications; REFERENCE-FIGURES has their NVLink per link)
        "b200": (2250, 180, 1800),
        "gb200": (2500, 186, 1800),
    }
    devices = {d.key: d for d in load_devices()}
    assert set(devices) == set(expected)
    for key, (tflops, gib, nvlink_bidir) in expected.items():
        device = devices[key]
        assert device.peak_flops == pytest.approx(tflops * 1e12), key
        assert device.memory == 2**30 * gib, key
        if nvlink_bidir is None:
            assert device.nvlink_bandwidth is None and device.nvlink_links == 0
        else:
            assert device.nvlink_bandwidth == pytest.approx(nvlink_bidir / 2 * 1e9), key
        assert "datasheet" in device.source or "REFERENCE" in device.source


@pytest.mark.parametrize(
    ("gpu_model", "key"),
    [
        ("H100", "h100-sxm"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("h200", "h200-sxm"),
        ("NVIDIA H800", "h800-sxm"),
        ("A100", "a100-sxm-80gb"),
        ("NVIDIA A800-SXM4-80GB", "a800-sxm-80gb"),
        ("L40S", "l40s"),
        ("B200", "b200"),
        ("NVIDIA GB200", "gb200"),
        ("L20", None),
        (None, None),
    ],
)
def test_find_device_by_profile_gpu_model(gpu_model, key):
    device = find_device(gpu_model)
    assert (device.key if device else None) == key


def test_a_broken_device_table_names_the_key(tmp_path):
    bad = tmp_path / "devices.yaml"
    bad.write_text(
        "devices:\n  - {key: x, names: [X], peak_flops: 10, memory: 1GiB, memory_bandwidth: 1GB/s,\n"
        "     pcie_bandwidth: 1GB/s, source: s}\n"
    )
    with pytest.raises(ProfileError, match=r"devices.0.peak_flops.*with a unit"):
        load_devices(bad)
