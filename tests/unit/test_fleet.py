"""A fleet baseline (`gpucluster baseline merge`): per key the median of the runs, the noise the
envelope of their intervals, what the runs agree on kept, and the gate holding a run against it."""

import json

import pytest

from pytest_gpucluster import cli
from pytest_gpucluster.results.baseline import RunResults, compare_runs, read_results
from pytest_gpucluster.results.fleet import merge_runs
from pytest_gpucluster.results.model import SCHEMA_VERSION, Measurement, Spread

GB = 1e9


def m(value, spread=None, attempt=1, metric="collectives.all_reduce.busbw", **labels):
    return Measurement(
        metric, value, "B/s", 1.0, ">=", None, "inter-node", {"size_bytes": 2**22, **labels},
        None if spread is None else Spread.of(spread), attempt=attempt,
    )  # fmt: skip


def run(source, measurements, hosts=("n1", "n2"), torch="2.3.0", started=1.0):
    fingerprint = {"hosts": list(hosts), "versions": {"torch": torch, "python": "3.11"}, "gpu_count": 8}
    return RunResults(
        source, tuple(measurements), (), fingerprint, {"NCCL_ALGO": "Ring"}, {"name": "p"}, started
    )


def test_median_of_the_runs_and_the_envelope_of_their_noise():
    runs = [
        run("a.json", [m(10 * GB, [9 * GB, 10 * GB, 11 * GB])]),
        run("b.json", [m(12 * GB, [11.5 * GB, 12 * GB, 12.5 * GB])]),
        run("c.json", [m(5 * GB), m(11 * GB, [10.8 * GB, 11 * GB], attempt=2)]),  # the confirmation counts
    ]
    fleet = merge_runs(runs)
    (merged,) = fleet.measurements
    assert merged.value == 11 * GB and merged.attempt == 1
    assert (merged.spread.min, merged.spread.max, merged.spread.n) == (9 * GB, 12.5 * GB, 3)
    assert merged.spread.values == (10 * GB, 12 * GB, 11 * GB)
    assert fleet.summary() == "fleet baseline of 3 runs, 1 measurements"


def test_what_the_runs_disagree_on_reads_mixed_and_hosts_are_the_union():
    fleet = merge_runs(
        [run("a.json", [m(1.0)], ("n1", "n2")), run("b.json", [m(2.0)], ("n3", "n4"), torch="2.4.0")]
    )
    data = fleet.to_json()
    assert data["fingerprint"]["hosts"] == ["n1", "n2", "n3", "n4"]
    assert data["fingerprint"]["versions"] == {"torch": "mixed: 2.3.0 | 2.4.0", "python": "3.11"}
    assert data["fingerprint"]["gpu_count"] == 8 and data["nccl_env"] == {"NCCL_ALGO": "Ring"}
    assert [r["source"] for r in data["fleet"]["runs"]] == ["a.json", "b.json"]
    assert data["schema_version"] == SCHEMA_VERSION and data["outcomes"] == []


def test_a_key_some_runs_lack_is_kept_with_the_runs_that_have_it():
    fleet = merge_runs([run("a.json", [m(1.0), m(3.0, size=1)]), run("b.json", [m(2.0)])])
    counts = sorted(x.spread.n for x in fleet.measurements)
    assert counts == [1, 2]
    assert "(1 present in only some of the runs)" in fleet.summary()


def test_a_run_is_held_against_the_lowest_the_fleet_measured():
    fleet = merge_runs(
        [run("a.json", [m(10 * GB, [9 * GB, 10 * GB])]), run("b.json", [m(11 * GB, [10.5 * GB, 11 * GB])])]
    )
    baseline = RunResults.from_json(fleet.to_json(), "fleet.json")
    ok = compare_runs(baseline, run("new.json", [m(8.8 * GB)]), 0.05).changes[0]
    # 12% below the median, 2.2% below the fleet's lowest: no regression (the fleet's 9-11 GB/s
    # range is wider than the 5% tolerance, so the row says it is not gateable here)
    assert ok.status == "not gateable"
    bad = compare_runs(baseline, run("new.json", [m(8.0 * GB)]), 0.05).changes[0]
    assert bad.status == "regression" and bad.old_n == 2


def _write(path, results):
    data = {
        "schema_version": SCHEMA_VERSION,
        "started_at": results.started_at,
        "fingerprint": results.fingerprint,
        "measurements": [x.to_json() for x in results.measurements],
        "outcomes": [],
    }
    path.write_text(json.dumps(data))
    return str(path)


def test_cli_baseline_merge_writes_a_results_file(tmp_path, capsys):
    a = _write(tmp_path / "a.json", run("a", [m(1.0, [0.9, 1.0])]))
    b = _write(tmp_path / "b.json", run("b", [m(3.0, [2.0, 3.0])]))
    out = tmp_path / "fleet.json"
    assert cli.main(["baseline", "merge", a, b, "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"{out}: fleet baseline of 2 runs, 1 measurements"
    fleet = read_results(out)
    assert fleet.fleet is not None and [r["source"] for r in fleet.fleet["runs"]] == [a, b]
    (merged,) = fleet.measurements
    assert (merged.value, merged.spread.min, merged.spread.max) == (2.0, 0.9, 3.0)
    assert cli.main(["baseline", "merge", a, b, "--out", str(out)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert cli.main(["baseline", "merge", a, b, "--out", str(out), "--force"]) == 0
    assert cli.main(["baseline", "merge", a, "--out", str(tmp_path / "one.json")]) == 2
    assert "two or more results files" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["missing.json", "broken.json"])
def test_cli_baseline_merge_names_an_unreadable_file(tmp_path, capsys, bad):
    (tmp_path / "broken.json").write_text("{")
    a = _write(tmp_path / "a.json", run("a", [m(1.0)]))
    assert cli.main(["baseline", "merge", a, str(tmp_path / bad), "--out", str(tmp_path / "f.json")]) == 2
    assert bad in capsys.readouterr().err
