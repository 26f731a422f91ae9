"""Known NCCL variable names, typo suggestions, and redaction of secrets."""

from __future__ import annotations

import pytest

from pytest_gpucluster.cluster.nccl_names import (
    NCCL_NAMES,
    REDACTED,
    UnknownName,
    is_secret_name,
    redact_env,
    unknown_nccl_names,
)

# The NCCL environment of seed 002 (8 x H200 on Spectrum-X), as written there.
SEED_002_ENV = (
    "NCCL_IB_HCA=mlx5_0,mlx5_1 NCCL_SOCKET_IFNAME=bond0 NCCL_IB_GID_INDEX=3 NCCL_IB_TC=106 "
    "NCCL_IB_QPS_PER_CONNECTION=4 NCCL_BUFFSIZE=8388608 NCCL_ALGO=Ring,Tree NCCL_COLLNET_ENABLE=0"
)


def test_names_people_set_are_known() -> None:
    common = {
        "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "NCCL_IB_GID_INDEX", "NCCL_IB_TC", "NCCL_IB_QPS_PER_CONNECTION",
        "NCCL_BUFFSIZE", "NCCL_ALGO", "NCCL_PROTO", "NCCL_COLLNET_ENABLE", "NCCL_NET", "NCCL_NET_PLUGIN",
        "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_NVLS_ENABLE", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS",
        "NCCL_DEBUG_FILE", "NCCL_CROSS_NIC", "NCCL_NET_GDR_LEVEL", "NCCL_IB_DISABLE", "NCCL_P2P_LEVEL",
        "NCCL_TUNER_PLUGIN", "NCCL_CUMEM_ENABLE", "NCCL_MIN_NCHANNELS", "NCCL_IB_GDR_LEVEL",
    }  # fmt: skip
    assert common <= NCCL_NAMES
    assert all(name.startswith("NCCL_") and name == name.upper() for name in NCCL_NAMES)


def test_the_seed_cluster_environment_has_no_unknown_name() -> None:
    env = dict(pair.split("=", 1) for pair in SEED_002_ENV.split())
    assert len(env) == 8
    assert unknown_nccl_names(env) == []


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("NCCL_IB_HCAS", "NCCL_IB_HCA"),
        ("NCCL_SOCKET_IFNAMES", "NCCL_SOCKET_IFNAME"),
        ("NCCL_SOCKET_IFACE", "NCCL_SOCKET_IFNAME"),
        ("NCCL_DEBUG_SUBSYSTEM", "NCCL_DEBUG_SUBSYS"),
        ("NCCL_IB_GID_IDX", "NCCL_IB_GID_INDEX"),
        ("NCCL_PROTOCOL", "NCCL_PROTO"),
        ("NCCL_NVLS_ENABLED", "NCCL_NVLS_ENABLE"),
        ("NCCL_BUFFER_SIZE", "NCCL_BUFFSIZE"),
        ("nccl_debug", "NCCL_DEBUG"),  # NCCL reads only the exact upper-case name
        ("Nccl_Ib_Hca", "NCCL_IB_HCA"),
    ],
)
def test_a_misspelt_name_is_reported_with_the_name_meant(typo: str, meant: str) -> None:
    [unknown] = unknown_nccl_names({typo: "1"})
    assert unknown == UnknownName(typo, meant)
    assert (
        str(unknown)
        == f"{typo} is not an NCCL environment variable, so NCCL ignores it; did you mean {meant}?"
    )


def test_a_name_close_to_nothing_gets_no_suggestion() -> None:
    assert unknown_nccl_names({"NCCL_FROBNICATE": "1"}) == [UnknownName("NCCL_FROBNICATE", None)]
    assert str(UnknownName("NCCL_FROBNICATE", None)).endswith("so NCCL ignores it")


def test_only_nccl_names_are_judged_and_order_is_kept() -> None:
    env = {
        "NCCL_IB_HCAS": "mlx5_0",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "NCCL_DEBUG": "INFO",
        "NCCL_ASYNC_ERROR_HANDLING": "1",  # PyTorch's old spelling, not NCCL's
        "NCCL_IBEXT_DISABLE": "1",  # read by the HPC-X net plugin
        "NCCL_SHARP_DISABLE": "1",
        "NCCL_TESTS_SPLIT_MASK": "0x7",  # read by nccl-tests
        "NCCL_ALGOS": "Ring",
    }
    assert [u.name for u in unknown_nccl_names(env)] == ["NCCL_IB_HCAS", "NCCL_ALGOS"]


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "GITHUB_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_ACCESS_KEY_ID",
        "WANDB_API_KEY",
        "OPENAI_APIKEY",
        "DB_PASSWORD",
        "SMTP_PASSWD",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "SLURM_AUTH",
        "MY_CLIENT_SECRET",
        "ssh_private_key",
        "api-key",
    ],
)
def test_secret_names_are_recognised(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "NCCL_IB_PKEY",  # InfiniBand partition key: fabric configuration, shown on purpose
        "TOKENIZERS_PARALLELISM",
        "NCCL_IB_HCA",
        "MASTER_ADDR",
        "KEYBOARD_LAYOUT",
        "MONKEY_PATCH",
        "PATH",
    ],
)
def test_ordinary_names_are_not_secret(name: str) -> None:
    assert not is_secret_name(name)


def test_redact_env_hides_secret_values_and_keeps_the_rest() -> None:
    env = {
        "NCCL_DEBUG": "INFO",
        "HF_TOKEN": "hf_aBcDeF123",
        "NCCL_IB_PKEY": "0x8001",
        "WANDB_API_KEY": "0123456789abcdef",
        "TOKENIZERS_PARALLELISM": "false",
        "EMPTY_TOKEN": "",
        "PIP_INDEX_URL": "https://builder:s3cr3t@pypi.example.com/simple",
        "HF_ENDPOINT": "https://huggingface.co",
    }
    before = dict(env)
    shown = redact_env(env)
    assert shown == {
        "NCCL_DEBUG": "INFO",
        "HF_TOKEN": REDACTED,
        "NCCL_IB_PKEY": "0x8001",
        "WANDB_API_KEY": REDACTED,
        "TOKENIZERS_PARALLELISM": "false",
        "EMPTY_TOKEN": "",
        "PIP_INDEX_URL": "https://<redacted>@pypi.example.com/simple",
        "HF_ENDPOINT": "https://huggingface.co",
    }
    assert list(shown) == list(env)
    assert env == before  # the caller's mapping is not touched
    assert not any(secret in str(shown) for secret in ("hf_aBcDeF123", "0123456789abcdef", "s3cr3t"))
