"""`gpucluster profiles derive` and `profiles check`: measured runs -> a validated profile."""

import json
from pathlib import Path

import pytest

from pytest_gpucluster.cli import main
from pytest_gpucluster.errors import ProfileError
from pytest_gpucluster.profiles.derive import (
    RULES,
    derive_files,
    format_quantity,
    parse_margin,
    read_run,
    rule_for,
)
from pytest_gpucluster.profiles.loader import known_profiles, load_profile, shipped_thresholds_dir
from pytest_gpucluster.results.model import Measurement, ThresholdRef
from pytest_gpucluster.results.recorder import Recorder

FINGERPRINT = {
    "hostname": "node001",
    "hosts": ["node001", "node002"],
    "gpu_model": "NVIDIA H200",
    "gpu_count": 8,
    "versions": {"torch": "2.5.1", "nccl": "2.21.5", "cuda": "12.4"},
}
STARTED = 1767225600.0  # 2026-01-01 00:00 UTC


def _record(path: Path, profile: str, points, started: float = STARTED) -> Path:
    """A results.json written by the real Recorder, with the header a session gives it."""
    loaded = load_profile(profile)
    recorder = Recorder(
        path=path,
        header={
            "profile": {"name": loaded.name, "path": str(loaded.path), "sha256": loaded.sha256},
            "fingerprint": FINGERPRINT,
        },
    )
    recorder.started_at = started
    for metric, value, threshold, unit, extra in points:
        recorder.check(metric, value, threshold, unit=unit, **extra)
    return path


CPU_POINTS = [
    ("inventory.cuda_available", 0.0, 0.0, "bool", {"comparison": "=="}),
    ("inventory.nodes", 1, 1, "nodes", {}),
    (
        "collectives.all_reduce.busbw",
        1.2345e9,
        0.3e9,
        "B/s",
        {"scope": "intra-node", "labels": {"size_bytes": 16 * 2**20}},
    ),
    (
        "collectives.all_reduce.busbw",
        1.1e9,
        None,
        "B/s",
        {"scope": "intra-node", "labels": {"size_bytes": 2**20}},
    ),
    (
        "collectives.all_reduce.latency",
        4.5e-4,
        3e-3,
        "s",
        {"scope": "intra-node", "labels": {"size_bytes": 1024}, "comparison": "<="},
    ),
    (
        "collectives.all_gather.busbw",
        0.9e9,
        0.1e9,
        "B/s",
        {"scope": "intra-node", "labels": {"size_bytes": 4 * 2**20}},
    ),
    ("demo.unmapped", 3.0, 1.0, "x", {}),
]


@pytest.fixture
def cpu_run(tmp_path):
    return _record(tmp_path / "run" / "results.json", "cpu-local", CPU_POINTS)


def test_derived_profile_gates_every_measured_threshold_at_the_margin(cpu_run, tmp_path):
    out = tmp_path / "my-cpu.yaml"
    derive_files(
        [cpu_run], name="my-cpu", margin_text="10%", from_baseline=False, out=out, echo=lambda _: None
    )
    profile = load_profile(str(out))
    assert profile.name == "my-cpu" and profile.model.extends == "cpu-local"
    assert profile.chain[1] == shipped_thresholds_dir() / "cpu-local.yaml"
    assert profile.model.cluster.backend == "gloo"  # carried over through extends
    checks = {(c.collective, c.size, c.scope): c for c in profile.model.collectives.checks}
    intra = "intra-node"
    measured = {
        ("all_reduce", 16 * 2**20, intra),
        ("all_reduce", 1024, intra),
        ("all_gather", 4 * 2**20, intra),
    }
    parents = {(c.collective, c.size, c.scope) for c in load_profile("cpu-local").model.collectives.checks}
    assert set(checks) == measured | parents  # the parent's unmeasured checks are kept
    assert checks["all_reduce", 16 * 2**20, intra].min_busbw == pytest.approx(
        1.11e9
    )  # 1.2345 x 0.9, rounded down
    assert checks["all_reduce", 1024, intra].max_latency == pytest.approx(495e-6)  # 450 us x 1.1
    assert checks["all_gather", 4 * 2**20, intra].min_busbw == pytest.approx(0.81e9)
    assert all(
        checks[k].source.startswith("derived from results.json of 2026-01-01 00:00 UTC") for k in measured
    )
    assert profile.warnings == ()


def test_derived_profile_records_its_source_run(cpu_run, tmp_path):
    out = tmp_path / "my-cpu.yaml"
    derive_files(
        [cpu_run], name="my-cpu", margin_text="10%", from_baseline=False, out=out, echo=lambda _: None
    )
    text = out.read_text()
    run = read_run(cpu_run)
    assert f"# Source run: {cpu_run.resolve()} (2026-01-01 00:00 UTC), profile cpu-local" in text
    assert f"fingerprint {run.fingerprint_id}" in text and "hosts node001, node002" in text
    assert "nccl 2.21.5" in text
    assert "# min_busbw: measured 1.234GB/s; -10%" in text
    assert "# max_latency: measured 450us; +10%" in text
    # what was not derived is listed, with why
    assert "#   demo.unmapped: no profile key for this metric (value 3 x)" in text
    assert "#   inventory.cuda_available: an inventory check" in text
    assert "size: 1MiB" not in text  # an info-only point (no threshold) is not a threshold


def test_several_runs_need_from_baseline_and_give_the_median(tmp_path):
    runs = [
        _record(
            tmp_path / f"r{i}.json",
            "cpu-local",
            [
                (
                    "collectives.all_reduce.busbw",
                    v,
                    0.3e9,
                    "B/s",
                    {"scope": "intra-node", "labels": {"size_bytes": 2**24}},
                )
            ],
            started=STARTED + i,
        )
        for i, v in enumerate([1.0e9, 1.3e9, 1.1e9])
    ]
    with pytest.raises(ProfileError, match="3 results files given: pass --from-baseline"):
        derive_files(runs, name="fleet", margin_text="10%", from_baseline=False, out=tmp_path / "f.yaml")
    out = tmp_path / "fleet.yaml"
    derive_files(runs, name="fleet", margin_text="10%", from_baseline=True, out=out, echo=lambda _: None)
    measured, *kept = load_profile(str(out)).model.collectives.checks
    assert measured.min_busbw == pytest.approx(0.99e9)  # median 1.1 GB/s x 0.9
    parents = load_profile("cpu-local").model.collectives.checks[1:]
    assert [(k.size, k.scope, k.max_latency, k.min_busbw) for k in kept] == [  # the parent's, unchanged
        (p.size, p.scope, p.max_latency, p.min_busbw) for p in parents
    ]
    text = out.read_text()
    assert "median 1.1GB/s of 3 runs (1GB/s, 1.3GB/s, 1.1GB/s)" in text
    assert text.count("# Source run:") == 3
    assert "# max_latency: not measured, kept from the parent" in text


def test_runs_of_different_profiles_are_refused(tmp_path):
    point = [
        (
            "collectives.all_reduce.busbw",
            1e9,
            0.3e9,
            "B/s",
            {"scope": "intra-node", "labels": {"size_bytes": 1}},
        )
    ]
    a = _record(tmp_path / "a.json", "cpu-local", point)
    b = _record(tmp_path / "b.json", "h800-ib", point)
    with pytest.raises(ProfileError, match="must come from runs of one profile"):
        derive_files([a, b], name="x", margin_text="10%", from_baseline=True, out=tmp_path / "x.yaml")


def _sft(key: str) -> dict:
    # as acceptance/test_sft.py records them (pytest_gpucluster/checks/sft.py)
    return {
        "labels": {"case": "llama2-7b-2node"},
        "ref": ThresholdRef("h200-spectrumx", ("sft", "cases", 0, key)),
    }


H200_POINTS = [
    # 100 samples/s on 16 GPUs; a step is 16 ranks x 8 x 16 samples = 2048 samples = 20.48 s
    ("sft.samples_per_s", 100.0, 50.0, "samples/s", _sft("min_samples_per_s")),
    ("sft.step_time", 20.48, 40.0, "s", {**_sft("max_step_time"), "comparison": "<="}),
    ("sft.mfu", 0.45, 0.3, "fraction", _sft("min_mfu")),
    # per rank: the most lenient (highest) ceiling / (lowest) floor of the ranks is kept
    *[
        (
            "sft.peak_memory",
            gib * 2**30,
            130 * 2**30,
            "B",
            {"labels": {"case": "llama2-7b-2node", "rank": r}, "comparison": "<="},
        )
        for r, gib in enumerate((98, 100, 99))
    ],
    *[
        ("sft.gpu_util", u, 0.9, "fraction", {"labels": {"case": "llama2-7b-2node", "rank": r}})
        for r, u in enumerate((0.97, 0.95, 0.99))
    ],
    (
        "scaling.efficiency",
        1.15,
        0.96,
        "fraction",
        {
            "labels": {"case": "llama2-7b-2node", "unit": "nodes", "from": 2, "to": 4},
            "ref": ThresholdRef("h200-spectrumx", ("scaling", "steps", 0, "min_efficiency")),
        },
    ),
    ("nvlink.speedup", 5.0, 3.0, "x", {}),
]


def test_derived_gpu_profile_keeps_case_settings_and_unmeasured_entries(tmp_path):
    run = _record(tmp_path / "results.json", "h200-spectrumx", H200_POINTS)
    out = tmp_path / "h200-ours.yaml"
    derive_files(
        [run], name="h200-ours", margin_text="10%", from_baseline=False, out=out, echo=lambda _: None
    )
    model = load_profile(str(out)).model
    [case] = model.sft.cases
    # the case's settings come back whole (sft.cases is a list: extends replaces it)
    assert (case.model, case.nodes, case.micro_batch, case.grad_accum, case.seq_len) == (
        "llama2-7b",
        2,
        8,
        16,
        2048,
    )
    assert case.attn_implementation == "flash_attention_2"
    assert case.min_samples_per_s == pytest.approx(90.0)
    assert case.max_step_time == pytest.approx(22.6)  # 20.48 x 1.1 = 22.528, rounded up
    assert case.min_mfu == pytest.approx(0.405)
    assert case.max_peak_memory == pytest.approx(110 * 2**30)
    assert case.min_gpu_util == pytest.approx(0.855)
    # efficiency floor capped at 100% (1.15 x 0.9 = 1.035); the unmeasured 4->8 step is kept
    steps = {(s.from_nodes, s.to_nodes): s.min_efficiency for s in model.scaling.steps}
    assert steps == {(2, 4): pytest.approx(1.0), (4, 8): pytest.approx(0.93)}
    assert model.scaling.case == "llama2-7b-2node"  # merged from the parent
    assert model.nvlink.min_speedup == pytest.approx(4.5) and model.nvlink.topology == "NV18"
    # collectives were not measured: inherited unchanged, NCCL environment too
    assert [c.min_busbw for c in model.collectives.checks] == [pytest.approx(431e9), pytest.approx(115e9)]
    assert model.nccl_env["NCCL_IB_GID_INDEX"] == "3"
    assert "capped at 100%" in out.read_text()


def test_a_derived_profile_that_breaks_physics_is_not_written(tmp_path):
    # an "intra-node" busbw of 2 TB/s on 8 H200 cannot be real: the derived floor would be refused
    point = [
        (
            "collectives.all_reduce.busbw",
            2000e9,
            431e9,
            "B/s",
            {"scope": "intra-node", "labels": {"size_bytes": 2**34}},
        )
    ]
    run = _record(tmp_path / "results.json", "h200-spectrumx", point)
    out = tmp_path / "bad.yaml"
    with pytest.raises(
        ProfileError, match=r"does not validate, so .*bad.yaml was not written(.|\n)*1,800 GB/s > 787.5"
    ):
        derive_files([run], name="bad", margin_text="10%", from_baseline=False, out=out)
    assert not out.exists() and list(tmp_path.glob("*.tmp.yaml")) == []


def test_margin_parsing_and_rounding():
    assert parse_margin("10%") == pytest.approx(0.1)
    assert parse_margin("5") == pytest.approx(0.05)
    assert parse_margin("0.2") == pytest.approx(0.2)
    for bad in ("100%", "-5%", "ten"):
        with pytest.raises(ProfileError, match="--margin"):
            parse_margin(bad)
    assert format_quantity(1.23456e9, "bandwidth", up=False) == "1.23GB/s"
    assert format_quantity(1.23456e9, "bandwidth", up=True) == "1.24GB/s"
    assert format_quantity(4.95e-4, "duration", up=True) == "495us"
    assert format_quantity(0.8555, "fraction", up=False) == "85.5%"
    assert format_quantity(110 * 2**30, "size", up=True) == "110GiB"


def test_every_rule_maps_to_a_real_profile_key():
    from pytest_gpucluster.profiles.schema import CollectiveCheck, NvlinkSection, ScalingStep, SftCase

    models = {"collective": CollectiveCheck, "sft": SftCase, "scaling": ScalingStep, "nvlink": NvlinkSection}
    for rule in RULES:
        assert rule.key in models[rule.target].model_fields, rule
    assert rule_for(Measurement("collectives.alltoall.busbw", 1.0, "B/s"))[1] == {"collective": "alltoall"}
    assert (
        rule_for(Measurement("sft.my-case.tokens_per_s_per_gpu", 1.0, "tokens/s"))[0].key
        == "min_tokens_per_s_per_gpu"
    )
    assert rule_for(Measurement("inventory.nodes", 1.0, "nodes")) is None


def test_one_key_gated_at_several_points_takes_the_most_lenient(tmp_path):
    # test_nvlink gates nvlink.min_speedup at every size of nvlink.speedup_sizes
    points = [
        (
            "nvlink.speedup",
            v,
            1.2,
            "x",
            {"labels": {"size_bytes": size}, "ref": ThresholdRef("cpu-local", ("nvlink", "min_speedup"))},
        )
        for size, v in ((2**20, 3.0), (2**24, 2.5), (2**26, 4.0))
    ]
    run = _record(tmp_path / "results.json", "cpu-local", points)
    out = tmp_path / "n.yaml"
    derive_files([run], name="n", margin_text="10%", from_baseline=False, out=out, echo=lambda _: None)
    assert load_profile(str(out)).model.nvlink.min_speedup == pytest.approx(2.25)  # 2.5 x 0.9
    assert "measured 2.5 x; -10% [the most lenient of 3 measured points]" in out.read_text()


def test_mapping_sections_take_any_threshold_key_their_ref_names(tmp_path):
    # burnin has no row in RULES: the key, and how to write it, come from the schema
    points = [
        (
            "burnin.cpu_matmul",
            50e9,
            10e9,
            "FLOP/s",
            {"labels": {"rank": 0}, "ref": ThresholdRef("cpu-local", ("burnin", "min_cpu_matmul"))},
        ),
        (
            "burnin.cpu_copy",
            8e9,
            1e9,
            "B/s",
            {"labels": {"rank": 0}, "ref": ThresholdRef("cpu-local", ("burnin", "min_cpu_memory_bandwidth"))},
        ),
        ("burnin.pcie_gen", 4, 4, "gen", {"ref": ThresholdRef("cpu-local", ("burnin", "min_pcie_gen"))}),
    ]
    run = _record(tmp_path / "results.json", "cpu-local", points)
    out = tmp_path / "b.yaml"
    derive_files([run], name="b", margin_text="10%", from_baseline=False, out=out, echo=lambda _: None)
    burnin = load_profile(str(out)).model.burnin
    assert burnin.min_cpu_matmul == pytest.approx(45e9)
    assert burnin.min_cpu_memory_bandwidth == pytest.approx(7.2e9)
    text = out.read_text()
    assert "min_cpu_matmul: 0.045TFLOP/s" in text
    assert "#   burnin.pcie_gen: no profile key for this metric" in text  # an integer takes no margin


def test_a_derived_profile_may_reuse_its_parents_name(cpu_run, tmp_path):
    # ./cpu-local.yaml extending "cpu-local" would find itself first: it extends the file by path
    out = tmp_path / "cpu-local.yaml"
    derive_files(
        [cpu_run], name="cpu-local", margin_text="10%", from_baseline=False, out=out, echo=lambda _: None
    )
    profile = load_profile(str(out))
    assert profile.chain[1].resolve() == (shipped_thresholds_dir() / "cpu-local.yaml").resolve()
    assert profile.model.extends.endswith("cpu-local.yaml") and "/" in profile.model.extends


def test_a_ref_naming_the_gated_key_maps_any_metric_name(tmp_path):
    # tests that say which profile key they gated against need no row in RULES
    point = [
        (
            "fabric.allreduce_bw",
            2.0e9,
            0.3e9,
            "B/s",
            {
                "ref": ThresholdRef("cpu-local", ("collectives", "checks", 0, "min_busbw")),
                "labels": {"whatever": 1},
            },
        ),
        (
            "fabric.small_latency",
            1e-3,
            3e-3,
            "s",
            {
                "comparison": "<=",
                "ref": ThresholdRef("cpu-local", ("collectives", "checks", 1, "max_latency")),
            },
        ),
    ]
    run = _record(tmp_path / "results.json", "cpu-local", point)
    out = tmp_path / "s.yaml"
    derive_files([run], name="s", margin_text="20%", from_baseline=False, out=out, echo=lambda _: None)
    busbw, latency = load_profile(str(out)).model.collectives.checks[:2]
    parent = load_profile("cpu-local").model.collectives.checks
    assert (busbw.size, busbw.min_busbw) == (parent[0].size, pytest.approx(1.6e9))
    assert (latency.size, latency.max_latency) == (parent[1].size, pytest.approx(1.2e-3))


# --------------------------------------------------------------------------------------------
# The commands
# --------------------------------------------------------------------------------------------


def test_cli_derive_writes_and_refuses_to_overwrite(cpu_run, tmp_path, capsys):
    out = tmp_path / "p.yaml"
    argv = ["profiles", "derive", str(cpu_run), "--name", "p", "--margin", "10%", "--out", str(out)]
    assert main(argv) == 0
    assert f"wrote {out}: 3 thresholds at 10% margin" in capsys.readouterr().out
    assert main(argv) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert main([*argv, "--force"]) == 0


def test_cli_check_accepts_every_shipped_file(capsys):
    files = sorted(str(p) for p in shipped_thresholds_dir().glob("*.yaml"))
    assert main(["profiles", "check", *files]) == 0
    out = capsys.readouterr().out
    assert out.count("ok    ") == len(files)
    assert "devices.yaml: device table, 12 devices" in out
    assert (
        "h800-ib.yaml: schema valid; 19 threshold(s) held against the peaks of H800 SXM "
        "(devices.yaml h800-sxm; named exactly)" in out
    )
    assert main(["profiles", "check", *sorted(known_profiles())]) == 0  # by name too


def test_cli_check_fails_with_the_arithmetic(tmp_path, capsys):
    text = (shipped_thresholds_dir() / "dgx-h100-ib.yaml").read_text().replace("460GB/s", "1000GB/s")
    (tmp_path / "fast.yaml").write_text(text)
    (tmp_path / "typo.yaml").write_text(
        "name: t\ndescription: d\ncluster: {device: cpu, backend: gloo, nodez: 1}\n"
    )
    code = main(["profiles", "check", "cpu-local", str(tmp_path / "fast.yaml"), str(tmp_path / "typo.yaml")])
    assert code == 2
    out, err = capsys.readouterr()
    assert "ok    cpu-local" in out
    assert "FAIL  " in err and "787.5 GB/s" in err and "cluster.nodez" in err


def test_profiles_show_still_works(capsys):
    assert main(["profiles", "cpu-local", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "cpu-local"


# --------------------------------------------------------------------------------------------
# The loop: run -> derive -> run with the derived profile (pytester, seconds)
# --------------------------------------------------------------------------------------------

GATED = """
def test_busbw(hw, results):
    check = hw.collectives.checks[0]
    results.check("collectives.all_reduce.busbw", 2.0e9, check.min_busbw, unit="B/s",
                  scope=check.scope, labels={"size_bytes": int(check.size)})
"""


def test_run_derive_rerun_with_the_derived_profile(pytester, tmp_path, monkeypatch):
    monkeypatch.delenv("GPUCLUSTER_HW", raising=False)
    monkeypatch.delenv("_GPUCLUSTER_SESSION_RESULTS_DIR", raising=False)
    pytester.makepyfile(test_gated=GATED)
    first = pytester.runpytest_inprocess("--hw=cpu-local", f"--results-dir={tmp_path / 'a'}")
    assert first.ret == 0
    out = tmp_path / "derived.yaml"
    assert (
        main(["profiles", "derive", str(tmp_path / "a" / "results.json"), "--name", "d", "--out", str(out)])
        == 0
    )
    second = pytester.runpytest_inprocess(f"--hw={out}", f"--results-dir={tmp_path / 'b'}")
    assert second.ret == 0
    [m] = json.loads((tmp_path / "b" / "results.json").read_text())["measurements"]
    assert m["threshold"] == pytest.approx(1.8e9)  # the derived floor, not cpu-local's 0.3 GB/s
