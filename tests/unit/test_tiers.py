"""Tiers (plans/tiers.py): which tier ``-m`` asks for, the durations a profile's ``tiers:`` sets
for it, and what they change in the plans: the quick tier's sweeps visit only the checked sizes
(every check still judged), the health job's load and deadline follow the tier's ``load``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import yaml

from pytest_gpucluster.checks.collectives import cases
from pytest_gpucluster.errors import ProfileError
from pytest_gpucluster.plans.burnin import health_part
from pytest_gpucluster.plans.collectives import sweep_part, sweep_requests
from pytest_gpucluster.plans.tiers import run_tier, tier_durations
from pytest_gpucluster.profiles.loader import load_profile


@pytest.mark.parametrize(
    ("markexpr", "tier"),
    [
        ("", "standard"),
        (None, "standard"),
        ("quick", "quick"),
        ("quick and not gpucluster", "quick"),
        ("standard", "standard"),
        ("not burnin", "standard"),
        ("burnin", "burnin"),
        ("standard or burnin", "burnin"),
        ("quick or burnin", "burnin"),
        ("(quick)", "quick"),
        ("quickly", "standard"),  # a marker that only starts like a tier is no tier
    ],
)
def test_the_run_takes_the_longest_tier_its_mark_expression_names(markexpr, tier):
    assert run_tier(markexpr) == tier


def test_without_a_tiers_section_quick_sweeps_the_checked_sizes_and_the_others_the_grid():
    model = load_profile("cpu-local").model
    quick, standard, burnin = (tier_durations(model, t) for t in ("quick", "standard", "burnin"))
    assert (quick.sweep, standard.sweep, burnin.sweep) == ("checked", "grid", "grid")
    assert quick.load_s is quick.soak_s is quick.numerics_s is None
    assert quick.source == "built-in defaults"
    assert quick.describe() == "tier quick: sweeps: checked sizes only (built-in defaults)"


def _profile(tmp_path, tiers):
    (tmp_path / "tiered.yaml").write_text(
        yaml.safe_dump({"name": "tiered", "description": "x", "extends": "cpu-local", "tiers": tiers})
    )
    return load_profile("tiered", [tmp_path]).model


def test_a_profile_sets_each_tiers_durations(tmp_path):
    model = _profile(
        tmp_path,
        {"quick": {"load": "2s"}, "burnin": {"load": "10min", "soak": "30min", "source": "site runbook"}},
    )
    quick, burnin = tier_durations(model, "quick"), tier_durations(model, "burnin")
    assert (quick.sweep, quick.load_s) == ("checked", 2.0)  # the quick default survives a partial entry
    assert (burnin.sweep, burnin.load_s, burnin.soak_s) == ("grid", 600.0, 1800.0)
    assert burnin.source == "profile tiered: tiers.burnin; site runbook"
    assert "soak 1800 s" in burnin.describe()


def test_a_typo_in_tiers_is_an_error_naming_the_key(tmp_path):
    with pytest.raises(ProfileError, match=r"tiers\.quick\.lod"):
        _profile(tmp_path, {"quick": {"lod": "2s"}})


def test_the_quick_sweep_visits_each_checked_size_once_and_no_grid():
    model = load_profile("cpu-local").model
    [all_reduce] = [c for c in cases(model.collectives) if c.id == "all_reduce-intra-node"]
    grid = sweep_requests(all_reduce, model.collectives.sweep)
    quick = sweep_requests(all_reduce, model.collectives.sweep, checked_only=True)
    assert len(grid) == 1 and grid[0].min_bytes < grid[0].max_bytes  # 1 KiB..16 MiB, every size
    assert [(r.min_bytes, r.max_bytes) for r in quick] == [(1024, 1024), (16 << 20, 16 << 20)]
    [unchecked] = [c for c in cases(model.collectives) if c.id == "all_gather-intra-node"]
    assert [(r.min_bytes, r.max_bytes) for r in sweep_requests(unchecked, model.collectives.sweep, checked_only=True)] == [
        (16 << 20, 16 << 20)
    ]  # fmt: skip


def test_the_quick_sweep_part_moves_about_half_the_bytes_on_a_gpu_node():
    """A grid growing by a factor of 2 sums to about twice its largest size, which is checked:
    the quick sweep moves about half, and skips every small size's per-size cost."""
    model = load_profile("h200-spectrumx").model
    [all_reduce] = [c for c in cases(model.collectives) if c.id == "all_reduce-intra-node"]
    kwargs = dict(cluster=model.cluster, ranks_per_node=8)
    grid = sweep_part(all_reduce, model.collectives, 1, "nccl", **kwargs)
    quick = sweep_part(all_reduce, model.collectives, 1, "nccl", checked_only=True, **kwargs)
    assert quick.timeout_s < 0.6 * grid.timeout_s, (quick.deadline, grid.deadline)
    assert len(quick.options["sweeps"]) == len({int(c.size) for _, c in all_reduce.checks})


def test_the_tiers_load_reaches_the_health_job_and_its_deadline():
    settings = SimpleNamespace(
        job_timeout=900.0,
        rendezvous_timeout=120.0,
        source={"job_timeout": "default", "rendezvous_timeout": "default"}.get,
    )
    plain, loaded = health_part(1, settings), health_part(1, settings, load_s=3600.0)
    assert plain.options["load_s"] == 5.0 and loaded.options["load_s"] == 3600.0
    assert loaded.timeout_s >= plain.timeout_s + 3000
    assert loaded.estimate_s == plain.estimate_s + 3595.0
    assert "+ the 3,600 s (60 min) GPU load" in loaded.deadline, loaded.deadline
