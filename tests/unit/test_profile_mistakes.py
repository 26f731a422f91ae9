"""Every class of mistake of issue 18 (thresholds/README.md, "Physics checks" 1-8): a minimal bad
profile that `gpucluster profiles check` rejects, naming the key and showing the arithmetic, and
its fixed twin that passes. Run through the real command (cli.main), on files written here."""

from pathlib import Path

import pytest

from pytest_gpucluster.cli import main

H100_NODE = """\
name: t
description: minimal profile for one check
cluster:
  nodes: {nodes}
  gpus_per_node: 8
  device: cuda
  backend: nccl
  gpu_model: {gpu_model}
"""


def check(capsys, tmp_path: Path, text: str, *flags: str) -> tuple[int, str]:
    """``gpucluster profiles check [flags] FILE`` on ``text``; (exit code, stdout + stderr)."""
    path = tmp_path / "t.yaml"
    path.write_text(text)
    code = main(["profiles", "check", *flags, str(path)])
    out, err = capsys.readouterr()
    return code, out + err


def node(nodes: int = 1, gpu_model: str = "H100 80GB HBM3", extra: str = "") -> str:
    return H100_NODE.format(nodes=nodes, gpu_model=gpu_model) + extra


def one_line(text: str) -> str:
    return " ".join(text.split())


# --------------------------------------------------------------------------------------------
# 1. Memory that cannot fit
# --------------------------------------------------------------------------------------------

LLAMA_7B_ONE_GPU = """\
sft:
  cases:
    - name: llama-7b-1gpu
      model: llama2-7b
      ranks_per_node: 1
      zero_stage: 2
      precision: fp16
      micro_batch: 2
      grad_accum: 4
      seq_len: 512
      gradient_checkpointing: true
      max_step_time: 7.7s{offload}
"""


def test_1_zero2_on_one_gpu_cannot_hold_adam_for_7b(capsys, tmp_path):
    text = node(gpu_model="A800-SXM4-80GB", extra=LLAMA_7B_ONE_GPU.format(offload=""))
    code, out = check(capsys, tmp_path, text)
    out = one_line(out)
    assert code == 2
    assert "key 'sft.cases[0]'" in out and "cannot fit on 1 rank" in out
    assert "6.738e9 parameters x (2 B 16-bit weights + 2 B gradients + 12 B Adam states" in out
    assert "ZeRO-2 over 1 rank partitions nothing" in out
    assert "= 16 B/parameter) = 100.4 GiB (107.8 GB)" in out
    assert "more than the 80 GiB (85.9 GB) device memory (devices.yaml a800-sxm-80gb)" in out
    assert "offload: optimizer" in out


def test_1_the_same_case_with_optimizer_offload_fits(capsys, tmp_path):
    text = node(
        gpu_model="A800-SXM4-80GB", extra=LLAMA_7B_ONE_GPU.format(offload="\n      offload: optimizer")
    )
    code, out = check(capsys, tmp_path, text)
    assert code == 0, out


def test_1_zero2_partitions_over_ranks_so_8_gpus_fit_without_offload(capsys, tmp_path):
    text = node(
        gpu_model="A800-SXM4-80GB",
        extra=LLAMA_7B_ONE_GPU.format(offload="").replace("ranks_per_node: 1", "ranks_per_node: 8"),
    )
    assert check(capsys, tmp_path, text)[0] == 0


def test_1_a_scaling_size_that_cannot_fit_is_refused_too(capsys, tmp_path):
    # fits on 8 ranks, not on the 1 rank the scaling section also runs it at
    case = LLAMA_7B_ONE_GPU.format(offload="").replace("ranks_per_node: 1", "ranks_per_node: 8")
    scaling = "scaling:\n  case: llama-7b-1gpu\n  unit: ranks\n  source: s\n  steps:\n    - {from_nodes: 1, to_nodes: 8, min_efficiency: 90%}\n"
    code, out = check(capsys, tmp_path, node(gpu_model="A800-SXM4-80GB", extra=case + scaling))
    assert code == 2 and "cannot fit on 1 rank (at scaling ranks=1" in one_line(out)


def test_1_the_a800_case_builds_a_deepspeed_config_that_offloads_the_optimizer():
    from pytest_gpucluster.plans.sft import workload_options
    from pytest_gpucluster.profiles.loader import load_profile
    from pytest_gpucluster.workloads.sft import SFTOptions, deepspeed_config

    profile = load_profile("a800-ib").model
    [case] = profile.sft.cases
    opts = SFTOptions.from_options(workload_options(case, profile.cluster))
    config = deepspeed_config(opts, world_size=1, precision="fp16", cuda=True)
    assert config["zero_optimization"] == {
        "stage": 2,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
    }
    assert "torch_adam" not in config["optimizer"]["params"]  # DeepSpeed's CPU Adam runs the step


def test_1_parameter_offload_needs_zero_3_at_load_time(capsys, tmp_path):
    text = node(extra=LLAMA_7B_ONE_GPU.format(offload="\n      offload: optimizer+params"))
    code, out = check(capsys, tmp_path, text)
    assert code == 2 and "sft.cases[0]" in out and "needs zero_stage 3" in out


# --------------------------------------------------------------------------------------------
# 2. A job that cannot finish in its timeout
# --------------------------------------------------------------------------------------------

LLAMA_70B = """\
sft:
  cases:
    - name: llama2-70b
      model: llama2-70b
      nodes: 4
      zero_stage: 3
      micro_batch: 1
      grad_accum: 44
      seq_len: 4096
      steps: 10
      warmup_steps: 2
      gradient_checkpointing: true
      min_mfu: 20%{timeout}
"""


def test_2_seed_001s_grad_accum_of_44_cannot_finish_in_the_default_timeout(capsys, tmp_path):
    code, out = check(capsys, tmp_path, node(nodes=4, gpu_model="H800", extra=LLAMA_70B.format(timeout="")))
    out = one_line(out)
    assert code == 2
    assert "key 'sft.cases[0].timeout'" in out and "cannot finish in its timeout" in out
    assert (
        "12 steps (warm-up included) x (1 x 44 x 4096 = 180,224 tokens per GPU x 444.5 GFLOP/token "
        "/ (989 TFLOP/s x 15% MFU) = 540 s per step) + 180 s start-up = 6,660 s (111 min)" in out
    )
    assert "> 900 s (15 min) (--job-timeout default" in out


def test_2_a_timeout_above_the_estimate_passes(capsys, tmp_path):
    text = node(nodes=4, gpu_model="H800", extra=LLAMA_70B.format(timeout="\n      timeout: 2h"))
    assert check(capsys, tmp_path, text)[0] == 0


def test_2_scaling_repeats_the_job_and_says_so(capsys, tmp_path):
    case = (
        LLAMA_70B.format(timeout="")
        .replace("nodes: 4", "nodes: 2")
        .replace("grad_accum: 44", "grad_accum: 8")
    )
    scaling = "scaling:\n  case: llama2-70b\n  source: s\n  steps:\n    - {from_nodes: 2, to_nodes: 4, min_efficiency: 90%}\n"
    code, out = check(capsys, tmp_path, node(nodes=4, gpu_model="H800", extra=case + scaling))
    assert code == 2 and "it runs 2 times (scaling), each under the same timeout" in one_line(out)


# --------------------------------------------------------------------------------------------
# 3. NCCL environment that contradicts a floor
# --------------------------------------------------------------------------------------------

NVLS_FLOOR = """\
collectives:
  checks:
    - {collective: all_reduce, scope: intra-node, size: 16GiB, min_busbw: 431GB/s, algo: NVLS}
"""


def test_3_ring_tree_everywhere_cannot_meet_an_nvls_floor(capsys, tmp_path):
    text = node(gpu_model="H200", extra="nccl_env:\n  NCCL_ALGO: Ring,Tree\n" + NVLS_FLOOR)
    code, out = check(capsys, tmp_path, text)
    out = one_line(out)
    assert code == 2
    assert "key 'collectives.checks[0].algo'" in out
    assert "NCCL_ALGO='Ring,Tree' (nccl_env)" in out and "leaves all_reduce only Ring, Tree" in out


def test_3_without_algo_the_message_gives_the_ring_arithmetic(capsys, tmp_path):
    text = node(
        gpu_model="H200", extra="nccl_env:\n  NCCL_ALGO: Ring,Tree\n" + NVLS_FLOOR.replace(", algo: NVLS", "")
    )
    code, out = check(capsys, tmp_path, text)
    out = one_line(out)
    assert code == 2 and "key 'collectives.checks[0].min_busbw'" in out
    assert "above what Ring reaches, 450 GB/s (devices.yaml" not in out  # the link is NVLink, named so
    assert "450 GB/s (NVLink per direction, devices.yaml h200-sxm) x 0.822 = 370 GB/s" in out
    assert "only NVLS can" in out and "scope it to other jobs (collectives.scope_env)" in out


def test_3_the_same_algorithm_scoped_to_inter_node_jobs_passes(capsys, tmp_path):
    text = node(
        gpu_model="H200",
        extra=NVLS_FLOOR.replace(
            "collectives:\n", "collectives:\n  scope_env:\n    inter-node: {NCCL_ALGO: 'Ring,Tree'}\n"
        ),
    )
    assert check(capsys, tmp_path, text)[0] == 0


def test_3_a_ring_derived_floor_passes_under_ring_tree(capsys, tmp_path):
    text = node(
        gpu_model="H200",
        extra="nccl_env:\n  NCCL_ALGO: Ring,Tree\n" + NVLS_FLOOR.replace("431GB/s, algo: NVLS", "350GB/s"),
    )
    assert check(capsys, tmp_path, text)[0] == 0


@pytest.mark.parametrize(
    ("algo", "message"),
    [
        ("Tree", "leaves Ring, all_gather, reduce_scatter, broadcast, reduce".replace("Ring, ", "")),
        ("allreduce:Tree", "uses per-collective syntax, which NCCL reads from 2.24 on"),
        ("Ring,Bogus", "NCCL refuses it: unknown algorithm 'Bogus'"),
    ],
)
def test_3_nccl_algo_values_nccl_would_misread(capsys, tmp_path, algo, message):
    code, out = check(capsys, tmp_path, node(extra=f"nccl_env:\n  NCCL_ALGO: '{algo}'\n"))
    assert code == 2 and "key 'nccl_env.NCCL_ALGO'" in out and message in one_line(out)


# --------------------------------------------------------------------------------------------
# 4. NIC selection by prefix
# --------------------------------------------------------------------------------------------


def test_4_mlx5_1_without_equals_also_selects_mlx5_10_to_19(capsys, tmp_path):
    code, out = check(capsys, tmp_path, node(extra="nccl_env:\n  NCCL_IB_HCA: mlx5_0,mlx5_1\n"))
    out = one_line(out)
    assert code == 1 and "warning:" in out
    assert "key 'nccl_env.NCCL_IB_HCA'" in out and "mlx5_1 also selects mlx5_10 ... mlx5_19" in out
    assert "NCCL_IB_HCA: '=mlx5_0,mlx5_1'" in out


@pytest.mark.parametrize(
    "extra",
    [
        "nccl_env:\n  NCCL_IB_HCA: '=mlx5_0,mlx5_1'\n",
        "nccl_env:\n  NCCL_IB_HCA: mlx5\nnccl_env_prefix_match: [NCCL_IB_HCA]\n",
        "nccl_env:\n  NCCL_IB_HCA: mlx5_0\n",  # no device is numbered mlx5_0N
    ],
)
def test_4_exact_lists_and_declared_prefixes_pass(capsys, tmp_path, extra):
    assert check(capsys, tmp_path, node(extra=extra))[0] == 0


# --------------------------------------------------------------------------------------------
# 5. Inter-node floors against the fabric
# --------------------------------------------------------------------------------------------

FABRIC = "  nics_per_node: 8\n  nic_line_rate: 400Gbps\n"


def inter_node(floor: str, algo: str = "", scope_env: str = "", min_version: str = "") -> str:
    text = node(nodes=2).replace("  gpu_model", FABRIC + "  gpu_model")
    text += "collectives:\n" + scope_env + "  checks:\n"
    text += f"    - {{collective: all_reduce, scope: inter-node, size: 8GiB, min_busbw: {floor}{algo}}}\n"
    return text + (f"nccl:\n  min_version: '{min_version}'\n" if min_version else "")


def test_5_a_floor_above_what_the_nics_carry_is_refused(capsys, tmp_path):
    code, out = check(capsys, tmp_path, inter_node("800GB/s", ", algo: Tree"))
    out = one_line(out)
    assert code == 2
    assert "8 NICs x 400 Gb/s (cluster.nics_per_node x cluster.nic_line_rate)" in out
    assert "x 2(n-1)/n = 1.875 (n = 16 ranks) / 2(U-1)/U = 1 (U = 2 nodes) = 750 GB/s" in out
    assert "800 GB/s > 750 GB/s" in out


def test_5_above_ring_needs_the_algorithm_recorded(capsys, tmp_path):
    code, out = check(capsys, tmp_path, inter_node("500GB/s"))
    out = one_line(out)
    assert code == 2 and "key 'collectives.checks[0].algo'" in out
    assert "400 GB/s (8 NICs x 400 Gb/s" in out and "record which with algo: Tree" in out


def test_5_a_tree_floor_must_force_tree_in_the_inter_node_job(capsys, tmp_path):
    code, out = check(capsys, tmp_path, inter_node("500GB/s", ", algo: Tree"))
    out = one_line(out)
    assert code == 2 and "also lets NCCL choose Ring on 2 nodes" in out
    assert "collectives.scope_env.inter-node.NCCL_ALGO: 'allreduce:Tree'" in out


def test_5_a_tree_floor_forced_in_its_job_passes(capsys, tmp_path):
    scoped = "  scope_env:\n    inter-node: {NCCL_ALGO: 'allreduce:Tree'}\n"
    assert check(capsys, tmp_path, inter_node("500GB/s", ", algo: Tree", scoped, "2.24"))[0] == 0


def test_5_a_floor_far_below_the_fabric_cannot_fail(capsys, tmp_path):
    code, out = check(capsys, tmp_path, inter_node("150GB/s"))
    out = one_line(out)
    assert code == 1 and "warning:" in out
    assert "min_busbw 150 GB/s (inter-node) is 37.5% of what Ring can reach" in out
    assert "a node with half its NICs down still passes" in out


def test_5_a_floor_near_the_fabric_passes(capsys, tmp_path):
    assert check(capsys, tmp_path, inter_node("350GB/s"))[0] == 0


def test_5_an_exact_nic_list_is_the_nics_nccl_uses(capsys, tmp_path):
    # 2 of 8 NICs by '=': Ring through them tops out at 100 GB/s, so a 115 GB/s floor needs Tree
    text = inter_node("920Gbps").replace("cluster:", "nccl_env:\n  NCCL_IB_HCA: '=mlx5_0,mlx5_1'\ncluster:")
    code, out = check(capsys, tmp_path, text)
    assert code == 2
    assert "2 NICs x 400 Gb/s (NCCL_IB_HCA='=mlx5_0,mlx5_1' selects 2 of cluster.nics_per_node 8" in one_line(
        out
    )


# --------------------------------------------------------------------------------------------
# 6. Gates that cannot fail
# --------------------------------------------------------------------------------------------

UTIL_ONLY = """\
sft:
  cases:
    - name: llama2-7b
      model: llama2-7b
      nodes: 1
      micro_batch: 4
      seq_len: 2048
      min_gpu_util: 90%{extra}
"""


def test_6_gpu_utilisation_alone_cannot_fail(capsys, tmp_path):
    code, out = check(capsys, tmp_path, node(extra=UTIL_ONLY.format(extra="")))
    out = one_line(out)
    assert code == 1 and "key 'sft.cases[0].min_gpu_util'" in out
    assert "gates only GPU utilisation" in out and "NCCL kernels spinning" in out


def test_6_utilisation_with_a_throughput_floor_passes(capsys, tmp_path):
    assert check(capsys, tmp_path, node(extra=UTIL_ONLY.format(extra="\n      min_mfu: 20%")))[0] == 0


def test_6_a_case_with_no_gate_at_all_is_flagged(capsys, tmp_path):
    text = node(
        extra=UTIL_ONLY.format(extra="").replace("      min_gpu_util: 90%\n", "      max_peak_memory: 70GB\n")
    )
    code, out = check(capsys, tmp_path, text)
    assert code == 1 and "key 'sft.cases[0]'" in out and "gates no throughput" in out


# --------------------------------------------------------------------------------------------
# 7. Thresholds without a source
# --------------------------------------------------------------------------------------------

SOURCED = node(
    extra="""\
nvlink:
  links_per_gpu: 18              # H100 SXM5 datasheet
  # nccl#1264: 376 vs 37 GB/s
  min_speedup: 3.0
"""
)


def test_7_strict_fails_on_a_number_without_a_source(capsys, tmp_path):
    text = SOURCED.replace("  # nccl#1264: 376 vs 37 GB/s\n", "")
    assert check(capsys, tmp_path, text)[0] == 0  # without --strict: fine
    code, out = check(capsys, tmp_path, text, "--strict")
    assert code == 1
    assert (
        "unsourced: " in out
        and "t.yaml, line 11, key 'nvlink.min_speedup': min_speedup: 3.0 has no source" in out
    )


def test_7_strict_passes_when_every_number_says_where_it_comes_from(capsys, tmp_path):
    code, out = check(capsys, tmp_path, SOURCED, "--strict")
    assert code == 0 and "0 unsourced" in out


def test_7_every_shipped_profile_passes_strict(capsys):
    from pytest_gpucluster.profiles.loader import shipped_thresholds_dir

    files = sorted(str(p) for p in shipped_thresholds_dir().glob("*.yaml"))
    assert main(["profiles", "check", "--strict", *files]) == 0, capsys.readouterr()


# --------------------------------------------------------------------------------------------
# 8. Device detection by substring
# --------------------------------------------------------------------------------------------


def test_8_a_family_is_not_a_part(capsys, tmp_path):
    code, out = check(capsys, tmp_path, node(gpu_model="H100"))
    out = one_line(out)
    assert code == 1 and "key 'cluster.gpu_model'" in out
    assert (
        "names a family, not a part (h100-sxm (H100 SXM5), h100-pcie (H100 PCIe), h100-nvl (H100 NVL))" in out
    )
    assert "--hw=auto never selects this profile" in out


@pytest.mark.parametrize("gpu_model", ["H100 80GB HBM3", "h100-sxm", "NVIDIA H100 80GB HBM3", "H100 PCIe"])
def test_8_a_part_by_its_name_or_key_passes(capsys, tmp_path, gpu_model):
    code, out = check(capsys, tmp_path, node(gpu_model=gpu_model))
    assert code == 0 and "named exactly" in out


def test_8_gh200_gets_its_own_peaks_not_h200s(capsys, tmp_path):
    # 100 GiB fits an H200 (141 GiB) but not a GH200's 96 GiB: substring matching would allow it
    case = "sft:\n  cases:\n    - {name: c, model: tiny, max_peak_memory: 100GiB, min_mfu: 1%}\n"
    code, out = check(capsys, tmp_path, node(gpu_model="GH200 480GB", extra=case))
    assert code == 2 and "above the device memory 96 GiB" in one_line(out)
