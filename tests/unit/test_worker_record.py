"""The rank's finished record (`workloads._worker._write_final_record`): what the parent reads."""

from __future__ import annotations

import json

from pytest_gpucluster.workloads._worker import _write_final_record


def test_a_json_value_is_written_with_the_time_the_rank_finished(tmp_path):
    path = tmp_path / "rank-0.json"
    record = {"rank": 0, "status": "ok", "value": {"busbw": 1.5}, "started_at": 1.0}
    assert _write_final_record(path, record) is True
    written = json.loads(path.read_text())
    assert written["status"] == "ok" and written["value"] == {"busbw": 1.5}
    assert written["finished_at"] >= written["started_at"]


def test_a_value_json_cannot_hold_fails_the_rank_as_a_type_error_without_the_value(tmp_path):
    path = tmp_path / "rank-1.json"
    record = {"rank": 1, "status": "ok", "value": {"tensor": object()}, "started_at": 1.0}
    assert _write_final_record(path, record) is False
    written = json.loads(path.read_text())
    assert written["status"] == "error" and "value" not in written
    assert written["error"]["type"] == "TypeError"
    assert written["error"]["message"] == "a workload returned a object, which is not JSON-serializable"
    assert written["rank"] == 1 and "finished_at" in written
