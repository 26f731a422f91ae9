"""The rank side of the numerics check through its CPU seam: dtype selection for GPUs that are not
here, the digest's sensitivity to every single bit, the chain's determinism, the known-answer
bound, and the whole workload with every dtype (tf32, fp16 and fp8 run on the CPU too)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pytest_gpucluster.workloads import _numerics_chain as nc  # noqa: E402
from pytest_gpucluster.workloads import numerics  # noqa: E402
from pytest_gpucluster.workloads._runtime import RankContext  # noqa: E402


@pytest.mark.parametrize(
    ("capability", "fp8", "runs", "skipped"),
    [
        ((9, 0), True, ["fp32", "tf32", "bf16", "fp16", "fp8"], []),  # H100/H200
        ((8, 9), True, ["fp32", "tf32", "bf16", "fp16", "fp8"], []),  # L40S
        ((8, 0), True, ["fp32", "tf32", "bf16", "fp16"], ["fp8"]),  # A100
        ((7, 0), True, ["fp32", "fp16"], ["tf32", "bf16", "fp8"]),  # V100
        ((9, 0), False, ["fp32", "tf32", "bf16", "fp16"], ["fp8"]),  # a torch without fp8
    ],
)
def test_a_gpu_runs_the_dtypes_its_part_and_torch_support(capability, fp8, runs, skipped) -> None:
    got, why = nc.select_dtypes(True, capability, fp8)
    assert got == runs
    assert sorted(why) == sorted(skipped)
    if "fp8" in why and fp8:
        assert "8.9+" in why["fp8"]


def test_a_cpu_runs_fp32_and_bf16_unless_the_profile_names_more() -> None:
    assert nc.select_dtypes(False, None, True) == (["fp32", "bf16"], {})
    got, why = nc.select_dtypes(False, None, True, ["bf16", "fp8", "int4"])
    assert got == ["bf16", "fp8"] and "unknown dtype 'int4'" in why["int4"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_the_digest_changes_with_every_single_bit_of_the_output(dtype: str) -> None:
    out = torch.randn(4, 8, generator=torch.Generator().manual_seed(3)).to(getattr(torch, dtype))
    sums = out.float().sum(dim=1)
    reference = nc.digest(torch, out, sums)
    bits = out.element_size() * 8
    for element in (0, 13, 31):
        for bit in range(bits):
            flipped = out.clone()
            raw = flipped.view(-1).view(torch.uint8)
            byte = element * out.element_size() + bit // 8
            raw[byte] = raw[byte] ^ (1 << (bit % 8))
            assert nc.digest(torch, flipped, sums) != reference, (element, bit)


def test_the_same_seed_gives_the_same_bits_and_another_seed_other_bits() -> None:
    spec = nc.DTYPES["bf16"]
    runs = [
        nc.chain(torch, spec, *nc.chain_inputs(torch, spec, 64, seed, "cpu"), 3, "cpu") for seed in (5, 5, 6)
    ]
    digests = [nc.digest(torch, out, sums) for out, sums in runs]
    assert digests[0] == digests[1] != digests[2]


@pytest.mark.parametrize("dtype", ["fp32", "tf32", "bf16", "fp16", "fp8"])
def test_the_known_answer_is_within_its_bound_and_a_wrong_gemm_is_not(dtype: str, monkeypatch) -> None:
    spec = nc.DTYPES[dtype]
    right = nc.known_answer(torch, spec, 32, 11, "cpu")
    assert 0 < right["ratio"] <= 1, right
    good = nc.matmul_fn

    def off_by_a_few_percent(torch_, spec_, device):
        mm = good(torch_, spec_, device)
        return lambda x, b: mm(x, b) * 1.25

    monkeypatch.setattr(nc, "matmul_fn", off_by_a_few_percent)
    wrong = nc.known_answer(torch, spec, 32, 11, "cpu")
    assert wrong["gemm_ratio"] > 1, wrong


def _ctx(tmp_path: Path, rank: int, **options) -> RankContext:
    return RankContext(
        rank=rank, world_size=2, local_rank=rank, local_world_size=2, node_rank=0, host="testhost",
        device="cpu", backend="gloo", job_dir=tmp_path, options={"threads": 1, **options},
    )  # fmt: skip


def test_the_workload_runs_every_dtype_on_the_cpu_seam_and_the_injected_flip_shows(tmp_path: Path) -> None:
    options = {
        "dtypes": ["fp32", "tf32", "bf16", "fp16", "fp8"],
        "seeds": [1, 2],
        "duration_s": 0.0,
        "matmul_n": 32,
    }
    clean = numerics.run(_ctx(tmp_path, 0, **options))
    hit = numerics.run(_ctx(tmp_path, 1, **options, inject={"rank": 1, "dtype": "fp16", "bit": 0}))
    assert list(clean["dtypes"]) == options["dtypes"] and clean["skipped"] == {}
    assert clean["injected"] is None
    assert hit["injected"] == {"dtype": "fp16", "seed": 1, "repeat": 0, "bit": 0}
    for name, done in clean["dtypes"].items():
        assert done["repeats"] == 2 and done["runs"] == 4 and done["flops"] > 0
        assert all(len(counts) == 1 for counts in done["digests"].values()), name
        assert done["known_answer"]["ratio"] <= 1
        if name != "fp16":
            assert hit["dtypes"][name]["digests"] == done["digests"], name
    assert len(hit["dtypes"]["fp16"]["digests"]["1"]) == 2  # the flipped run, then the right one
    assert hit["dtypes"]["fp16"]["digests"]["2"] == clean["dtypes"]["fp16"]["digests"]["2"]
    # the determinism settings are restored for the parts that share the process
    assert torch.backends.cuda.matmul.fp32_precision == "none"
    assert torch.get_float32_matmul_precision() == "highest"  # raises where both TF32 APIs were used
    assert clean["platform"]["key"] == hit["platform"]["key"]


def test_an_fp8_kernel_this_torch_lacks_is_skipped_saying_why_but_any_other_failure_fails(
    tmp_path: Path, monkeypatch
) -> None:
    real = nc.chain

    def broken(torch_, spec, *args):
        if spec.name in ("fp8", "bf16"):
            raise RuntimeError(f"no {spec.name} kernel for you")
        return real(torch_, spec, *args)

    monkeypatch.setattr(nc, "chain", broken)
    options = {"dtypes": ["fp32", "fp8"], "seeds": [1], "duration_s": 0.0, "matmul_n": 32}
    done = numerics.run(_ctx(tmp_path, 0, **options))
    assert list(done["dtypes"]) == ["fp32"]
    assert done["skipped"] == {"fp8": "RuntimeError: no fp8 kernel for you"}
    with pytest.raises(RuntimeError, match="no bf16 kernel"):
        numerics.run(_ctx(tmp_path, 0, **{**options, "dtypes": ["bf16"]}))


def test_a_gpu_rank_names_its_gpu_by_bus_id_and_its_platform_by_part_sms_and_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU side of the record through a stand-in for torch.cuda (no GPU here): what a GPU's
    properties turn into, as torch 2.x reports them for an H100 SXM5."""
    from types import SimpleNamespace

    props = SimpleNamespace(
        name="NVIDIA H100 80GB HBM3", major=9, minor=0, multi_processor_count=132,
        pci_bus_id=0x3B, pci_domain_id=0, pci_device_id=0,
    )  # fmt: skip
    fake = SimpleNamespace(
        __version__="2.7.1+cu128",
        version=SimpleNamespace(cuda="12.8"),
        cuda=SimpleNamespace(get_device_properties=lambda index: props, current_device=lambda: 3),
        _C=SimpleNamespace(_cuda_getDriverVersion=lambda: 12080),
    )
    ctx = RankContext(
        rank=3, world_size=8, local_rank=3, local_world_size=8, node_rank=0, host="node7",
        device="cuda:3", backend="nccl", job_dir=tmp_path,
    )  # fmt: skip
    dev = SimpleNamespace(index=3)
    assert numerics._gpu_label(fake, ctx, dev) == "GPU 3 (00000000:3B:00.0)"
    monkeypatch.setattr(numerics, "cublas_version", lambda: "12.8.4.1")
    info = numerics._platform(fake, ctx, dev)
    assert info["key"] == (
        "NVIDIA H100 80GB HBM3, 132 SMs, torch 2.7.1+cu128, CUDA 12.8, driver CUDA 12.8, cuBLAS 12.8.4.1"
    )
    monkeypatch.setattr(numerics, "cublas_version", lambda: "12.9.1.4")
    assert numerics._platform(fake, ctx, dev)["key"] != info["key"]  # another cuBLAS: another platform
    assert info["capability"] == "9.0" and info["sm_count"] == 132
    del props.pci_bus_id
    props.uuid = "5a1b"
    assert numerics._gpu_label(fake, ctx, dev) == "GPU 3 (GPU-5a1b)"
    fake._C = SimpleNamespace()
    assert numerics._platform(fake, ctx, dev)["key"].endswith("driver CUDA None, cuBLAS 12.9.1.4")


def test_the_cublas_version_is_read_from_the_library_the_process_loaded(tmp_path: Path) -> None:
    """A /proc/self/maps line as Linux writes it for a torch wheel's cuBLAS (nvidia-cublas-cu12)."""
    lib = tmp_path / "site-packages" / "nvidia" / "cublas" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcublas.so.12").write_bytes(b"")
    maps = tmp_path / "maps"
    maps.write_text(
        "7f0a2c000000-7f0a2c3f1000 r--p 00000000 103:02 4456123    /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        f"7f0a30000000-7f0a30a00000 r-xp 00000000 103:02 4456789    {lib}/libcublas.so.12\n"
        "7f0a34000000-7f0a34a00000 r-xp 00000000 103:02 4456790    /usr/local/cuda/lib64/libcublas.so.12.4.5.8\n"
    )
    assert numerics.cublas_version(str(maps)) == "12.4.5.8"  # the soname alone says only the major
    (lib / "libcublas.so.12").unlink()
    (lib / "libcublas.so.12.8.4.1").write_bytes(b"")
    (lib / "libcublas.so.12").symlink_to(lib / "libcublas.so.12.8.4.1")
    assert numerics.cublas_version(str(maps)) == "12.8.4.1"  # the file the soname points at
