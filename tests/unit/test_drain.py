"""The drain list: suspects.json and the scontrol argv lists, run only on request and never as a shell line."""

from __future__ import annotations

import json
import subprocess
import threading

import pytest

from pytest_gpucluster.burnin import BurninError
from pytest_gpucluster.burnin.drain import (
    SUSPECTS_FILE,
    Suspect,
    drain_argv,
    drain_commands,
    read_suspects,
    run_drain,
    shell_line,
    write_suspects,
)

SLOW = Suspect(node="node17", rank=3, check="straggler", reason="rank 3 on node17: 20 ms per iteration")
GPU = Suspect(
    node="node04",
    gpu="GPU 2 (00000000:3b:00.0)",
    kind="gpu",
    check="counters",
    reason="XID 79 during the run",
)
LINK = Suspect(
    node="node01", peer="node02", kind="link", check="pairwise", reason="pair slow, each node fine"
)


def test_the_drain_command_is_an_argv_list():
    assert drain_argv("node17", "slow all_reduce: 0.2 GB/s") == [
        "scontrol",
        "update",
        "NodeName=node17",
        "State=DRAIN",
        "Reason=gpucluster burn-in: slow all_reduce: 0.2 GB/s",
    ]


def test_a_reason_with_shell_characters_stays_one_argument_on_one_line():
    argv = drain_argv("node17", 'bad "GPU"; rm -rf / $(reboot)\nsecond line')
    assert len(argv) == 5
    assert argv[4] == 'Reason=gpucluster burn-in: bad "GPU"; rm -rf / $(reboot) second line'
    # Printed for people, quoted so that pasting it runs the same single command.
    assert shell_line(argv).endswith(
        """'Reason=gpucluster burn-in: bad "GPU"; rm -rf / $(reboot) second line'"""
    )


def test_a_long_reason_is_cut():
    reason = drain_argv("n1", "x" * 500)[4]
    assert len(reason) == len("Reason=") + 200 and reason.endswith("...")


@pytest.mark.parametrize("name", ["n[1-3]", "a,b", "node 1", "", "-n1", "node17;reboot"])
def test_a_node_name_that_would_drain_more_than_one_node_is_refused(name):
    with pytest.raises(BurninError, match="Slurm node name"):
        drain_argv(name, "slow")


def test_one_command_per_node_and_links_are_not_drained():
    second = Suspect(node="node17", check="pairwise", reason="slow with every partner")
    commands = drain_commands([SLOW, GPU, LINK, second, SLOW])
    assert [c[2] for c in commands] == ["NodeName=node17", "NodeName=node04"]
    assert (
        commands[0][4]
        == "Reason=gpucluster burn-in: rank 3 on node17: 20 ms per iteration (+1 more in suspects.json)"
    )


def test_suspects_json_is_written_even_when_empty(tmp_path):
    path = tmp_path / SUSPECTS_FILE
    assert write_suspects(path, []) == []
    assert json.loads(path.read_text()) == {"schema_version": 1, "suspects": [], "drain_commands": []}


def test_suspects_json_holds_node_reason_evidence_and_the_command(tmp_path):
    path = tmp_path / SUSPECTS_FILE
    slow = Suspect(
        node="node17", rank=3, check="straggler", reason="slow", evidence={"value": 0.02}, source="t::x"
    )
    write_suspects(path, [slow, LINK])
    data = json.loads(path.read_text())
    assert data["suspects"][0] == {
        "node": "node17",
        "kind": "node",
        "check": "straggler",
        "reason": "slow",
        "evidence": {"value": 0.02},
        "rank": 3,
        "source": "t::x",
        "drain_command": [
            "scontrol",
            "update",
            "NodeName=node17",
            "State=DRAIN",
            "Reason=gpucluster burn-in: slow",
        ],
    }
    assert "drain_command" not in data["suspects"][1] and data["suspects"][1]["peer"] == "node02"
    assert data["drain_commands"] == [data["suspects"][0]["drain_command"]]
    assert read_suspects(path) == [slow, LINK]


def test_writes_merge_and_drop_duplicates(tmp_path):
    path = tmp_path / SUSPECTS_FILE
    write_suspects(path, [SLOW])
    merged = write_suspects(path, [SLOW, GPU])
    assert merged == [SLOW, GPU]
    assert read_suspects(path) == [SLOW, GPU]


def test_concurrent_writers_lose_nothing(tmp_path):
    # pytest-xdist workers add to one file; the flock makes each read-merge-write whole.
    path = tmp_path / SUSPECTS_FILE

    def add(worker: int) -> None:
        for i in range(15):
            write_suspects(path, [Suspect(node=f"n{worker}x{i}", check="t", reason="r")])

    threads = [threading.Thread(target=add, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(read_suspects(path)) == 45


def test_a_damaged_file_is_an_error_naming_it(tmp_path):
    path = tmp_path / SUSPECTS_FILE
    path.write_text("{not json")
    with pytest.raises(BurninError, match=str(path)):
        write_suspects(path, [SLOW])
    path.write_text('{"other": 1}')
    with pytest.raises(BurninError, match="no 'suspects' list"):
        read_suspects(path)


def test_run_drain_runs_argv_without_a_shell_and_goes_on_after_a_failure():
    seen = []

    def fake_run(argv, **kwargs):
        seen.append((argv, kwargs))
        code = 1 if "NodeName=node17" in argv else 0
        return subprocess.CompletedProcess(
            argv, code, "", "slurm_update error: Invalid node name" if code else ""
        )

    outcomes = run_drain(drain_commands([SLOW, GPU]), run=fake_run)
    assert [o.ok for o in outcomes] == [False, True]
    assert all(isinstance(argv, list) and "shell" not in kwargs for argv, kwargs in seen)
    assert outcomes[0].line().startswith("FAILED with exit code 1: scontrol update NodeName=node17")
    assert outcomes[0].line().endswith(": slurm_update error: Invalid node name")


def test_run_drain_without_scontrol_says_so():
    [outcome] = run_drain([["gpucluster-no-such-scontrol", "update", "NodeName=n1"]])
    assert outcome.returncode is None and not outcome.ok
    assert outcome.line().startswith(
        "could not run gpucluster-no-such-scontrol update NodeName=n1: FileNotFoundError"
    )
