"""Every shipped profile loads; every kind of bad profile input gets a message naming file and key."""

from pathlib import Path

import pytest

from pytest_gpucluster.errors import ProfileError
from pytest_gpucluster.profiles.loader import known_profiles, load_profile

SHIPPED = sorted(known_profiles())


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profiles_validate(name):
    profile = load_profile(name)
    assert profile.name == name
    assert profile.model.description


def test_expected_profiles_are_shipped():
    assert {"cpu-local", "h200-spectrumx", "h800-ib", "a800-ib", "aws-g6e-efa", "dgx-h100-ib"} <= set(SHIPPED)


def test_extends_merges_sections():
    h200 = load_profile("h200-spectrumx").model
    assert h200.cluster.gpus_per_node == 8  # from the base
    assert h200.cluster.gpu_model == "H200"  # its own
    assert h200.collectives.sweep.max_bytes == 16 * 2**30  # base section kept beside own checks
    assert h200.collectives.checks[1].min_busbw == pytest.approx(115e9)  # 920Gbps


GOOD = """\
name: t
description: test profile
cluster:
  device: cpu
  backend: gloo
collectives:
  checks:
    - {collective: all_reduce, size: 1MiB, min_busbw: 1GB/s}
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


# (case id, files to write {name: text}, profile to load, fragments the message must contain)
BAD_INPUTS = [
    ("yaml-syntax", {"p": "name: t\ncluster: [unclosed\n"}, "p", ["p.yaml", "line 2", "invalid YAML"]),
    (
        "unknown-key",
        {"p": GOOD.replace("size: 1MiB", "size: 1MiB, min_bwsbw: 3GB/s")},
        "p",
        ["p.yaml", "line 8", "collectives.checks[0].min_bwsbw", "unknown key", "min_busbw"],
    ),
    (
        "wrong-type",
        {"p": GOOD.replace("  device: cpu\n", "  device: cpu\n  nodes: many\n")},
        "p",
        ["p.yaml", "line 5", "cluster.nodes", "many"],
    ),
    (
        "bad-unit",
        {"p": GOOD.replace("1GB/s", "1 parsec")},
        "p",
        ["p.yaml", "line 8", "collectives.checks[0].min_busbw", "unknown unit", "parsec"],
    ),
    (
        "negative-bandwidth",
        {"p": GOOD.replace("1GB/s", "-5GB/s")},
        "p",
        ["p.yaml", "collectives.checks[0].min_busbw", "non-negative", "-5GB/s"],
    ),
    (
        "missing-extends-target",
        {"p": "extends: no-such-base\n" + GOOD},
        "p",
        ["p.yaml", "line 1", "'extends'", "no-such-base", "Known profiles"],
    ),
    (
        "extends-cycle",
        {"a": "extends: b\n" + GOOD, "b": "extends: a\n" + GOOD},
        "a",
        ["cycle", "a.yaml", "b.yaml"],
    ),
    ("unknown-profile", {}, "nope", ["unknown hardware profile 'nope'", "cpu-local", "h200-spectrumx"]),
    ("empty-file", {"p": "\n# only a comment\n"}, "p", ["p.yaml", "empty"]),
    (
        "non-mapping",
        {"p": "- name: t\n- cluster: {}\n"},
        "p",
        ["p.yaml", "top level must be a mapping", "list"],
    ),
    (
        "missing-required",
        {"p": "name: t\ncluster: {device: cpu, backend: gloo}\n"},
        "p",
        ["p.yaml", "key 'description'", "required key is missing"],
    ),
    (
        "cross-field",
        {"p": GOOD.replace("backend: gloo", "backend: nccl")},
        "p",
        ["p.yaml", "line 3", "key 'cluster'", "cannot use the nccl backend"],
    ),
    (
        "bad-env-value",
        {"p": GOOD + "nccl_env:\n  NCCL_IB_HCA: [mlx5_0]\n"},
        "p",
        ["p.yaml", "line 9", "nccl_env", "NCCL_IB_HCA"],
    ),
]


@pytest.mark.parametrize(
    ("files", "target", "fragments"), [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS]
)
def test_bad_profile_input_names_file_and_key(tmp_path, files, target, fragments):
    for name, text in files.items():
        _write(tmp_path, name, text)
    with pytest.raises(ProfileError) as excinfo:
        load_profile(target, [tmp_path])
    message = str(excinfo.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from: {message}"


def test_profile_by_path_and_hash_changes_with_content(tmp_path):
    path = _write(tmp_path, "mine", GOOD)
    first = load_profile(str(path))
    path.write_text(GOOD.replace("1GB/s", "2GB/s"))
    second = load_profile(str(path))
    assert first.model.collectives.checks[0].min_busbw == 1e9
    assert second.model.collectives.checks[0].min_busbw == 2e9
    assert first.sha256 != second.sha256


def test_user_dir_overrides_shipped_name(tmp_path):
    _write(tmp_path, "cpu-local", GOOD.replace("name: t", "name: cpu-local"))
    assert load_profile("cpu-local", [tmp_path]).path.parent == tmp_path


def test_documented_example_validates(tmp_path):
    import re

    readme = (Path(__file__).resolve().parents[2] / "thresholds" / "README.md").read_text()
    example = re.search(r"```yaml\n(.*?)```", readme, re.S).group(1)
    path = _write(tmp_path, "my-h100-pod", example)
    profile = load_profile(str(path))
    assert profile.model.cluster.gpu_model == "H100 80GB HBM3"  # from dgx-h100-ib through extends
    assert profile.model.collectives.checks[2].max_latency == pytest.approx(40e-6)
    # the example is what the README asks for: no warnings, every threshold sourced
    from pytest_gpucluster.profiles.sources import unsourced_thresholds

    assert profile.warnings == ()
    assert unsourced_thresholds(profile.chain) == ()


def test_shipped_profiles_found_in_a_wheel_layout_and_a_checkout(tmp_path):
    from pytest_gpucluster.profiles.loader import shipped_thresholds_dir

    checkout_pkg = tmp_path / "checkout" / "pytest_gpucluster"
    checkout_pkg.mkdir(parents=True)
    assert shipped_thresholds_dir(checkout_pkg) == tmp_path / "checkout" / "thresholds"
    wheel_pkg = tmp_path / "site-packages" / "pytest_gpucluster"
    (wheel_pkg / "thresholds").mkdir(parents=True)
    assert shipped_thresholds_dir(wheel_pkg) == wheel_pkg / "thresholds"
