"""The findings reference: reason classes and the action ladder (``results.findings``), which
metrics only hardware fails, and the class of every fabric counter (``parsers.fabric_diff``)."""

from __future__ import annotations

from docs.gen.md import GENERATED, cell, code, prose, table

__all__ = ["render_findings"]


def _docstring_body(doc: str) -> str:
    """The module docstring without its first line (the title) and its implementation notes."""
    paragraphs = prose(doc, markup=True).split("\n\n")[1:]
    return "\n\n".join(p for p in paragraphs if not p.startswith(("Pure", "Pure:")))


def render_findings() -> str:
    from pytest_gpucluster.parsers import fabric_diff
    from pytest_gpucluster.results import findings

    out = [
        GENERATED,
        "# Findings: reason classes and actions\n",
        "Every failure of a run becomes a *finding*: what failed and where (host, GPU, port or link), "
        "the measured value against its threshold and the profile key it comes from, a reason class "
        "and the next action. The terminal summary, the report, results.json (`findings`) and the drain "
        "list (`suspects.json`) say the same thing. How to act on one: "
        "[Read a finding](../how-to/read-a-finding.md).\n",
        "## The rules (`results/findings.py`)\n",
        _docstring_body(findings.__doc__ or "") + "\n",
        "## Reason classes\n",
        f"{len(findings.REASONS)} classes (`REASONS`): "
        + ", ".join(code(r) for r in findings.REASONS)
        + ".\n",
        "\n## The action ladder\n",
        "Cheapest first. A finding gets the lowest rung its evidence supports; climb one rung when the "
        "same finding comes back after the action. The actions from `drain node` up take the host out "
        "of scheduling: `--gpucluster-drain` drains those hosts at the end of the session.\n",
        table(
            ("rung", "action", "what to do"),
            ((str(i + 1), code(a), cell(findings.ACTIONS[a])) for i, a in enumerate(findings.LADDER)),
        ),
        "\n## Metrics only hardware fails\n",
        f"A failure of a metric starting with one of these is a `hardware` finding even with no peer to "
        f"compare (elsewhere a value is an outlier only when at least {findings.MIN_PEERS} peers were "
        "judged and most of them passed):\n",
        ", ".join(code(m) for m in findings.HARDWARE_METRICS) + ".\n",
        "Metrics whose failure asks for an RMA: "
        + ", ".join(code(m) for m in findings.RMA_METRICS)
        + ". Metrics whose `device`, `port` or `pair` label names a NIC port or a link between two "
        "nodes (their hardware action is `reseat/replace cable or NIC`): "
        + ", ".join(code(m) for m in findings.PORT_METRICS)
        + ".\n",
        "\n## Fabric counter classes (`parsers/fabric_diff.py`)\n",
        "How a counter's growth over the run is judged: `link` at zero growth, `retransmit` as a rate "
        "per GB the port moved, `drop` recorded and gated only where the profile sets an allowance "
        "(why, with the sources: [XID and counter classes](../explanation/counters-and-xids.md)).\n",
    ]
    by_class: dict[str, list[str]] = {}
    for name, klass in fabric_diff.COUNTER_CLASSES.items():
        by_class.setdefault(klass, []).append(name)
    out.append(
        table(
            ("class", "counters"),
            ((code(k), ", ".join(code(n) for n in names)) for k, names in by_class.items()),
        )
    )
    from pytest_gpucluster.checks.burnin import xid_catalog, xid_classes, xid_recovery

    out += [
        "\n## XID classes (`checks/burnin/xid_classes.py`, `checks/burnin/xid_catalog.py`)\n",
        "How an XID read after the load is judged: by its immediate-action resolution bucket in NVIDIA's "
        "XID catalog, kept as the catalog writes it. A bucket that asks nothing of the GPU ("
        + ", ".join(code(b) for b in sorted(xid_classes.WARNING_BUCKETS))
        + ") is a recorded warning, never a suspect; every other bucket makes the GPU a suspect with "
        f"its action. An XID not listed is a suspect with the action `{xid_classes.UNKNOWN_ACTION}` (why: "
        "[Faults judged by their cause](../explanation/faults-by-cause.md)).\n",
        table(
            ("catalog bucket", "action", "what to do"),
            (
                (code(b), code(a), cell(xid_classes.BUCKET_ADVICE[b]))
                for b, a in xid_classes.BUCKET_ACTIONS.items()
            ),
        ),
        "\nThe XIDs the table holds: every row of the catalog with an immediate-action bucket, except the "
        'codes it marks "Unused" with `CONTACT_SUPPORT` (judged as any unlisted code). Each row cites its '
        "source; `tests/unit/test_xid_catalog.py` checks every row against the saved catalog excerpt "
        "`tests/data/xid_catalog/xid_catalog.csv` (provenance and cross-checks: its `README.md`).\n",
        table(
            ("XID", "mnemonic", "description", "catalog bucket", "action", "source"),
            (
                (str(c.xid), code(c.mnemonic), cell(c.name), code(c.bucket), code(c.action), code(c.source))
                for c in sorted(xid_classes.XID_CLASSES.values(), key=lambda c: c.xid)
            ),
        ),
        "\nSources:\n",
        "\n".join(f"- {code(key)}: {cell(text)}" for key, text in xid_catalog.SOURCES.items()) + "\n",
        "\n### Xid 154: the recovery action its line names (`checks/burnin/xid_recovery.py`)\n",
        "An Xid 154 line (`GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)`) is "
        "judged by the code it changed *to* (NVML's `nvmlDeviceGpuRecoveryAction_t`; the words beside it vary "
        "between drivers), as the bucket below; a code not listed, or a line naming none, keeps `XID_154` "
        f"(`{xid_classes.BUCKET_ACTIONS['XID_154']}`). An Xid 154 heard through NVML's events has no line: "
        "the XID listener reads the GPU's recovery action from NVML as the event arrives "
        "(`nvmlDeviceGetGpuRecoveryAction` where the installed nvidia-ml-py has it, else the field "
        "`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`) and the code it read is judged by the same table; where that "
        "read failed, the event keeps `XID_154` and the finding says why.\n",
        table(
            ("code", "NVML action", "judged as", "action", "what NVIDIA asks"),
            (
                (
                    f"0x{a.code:x}",
                    code(a.nvml),
                    code(a.bucket),
                    code(xid_classes.BUCKET_ACTIONS[a.bucket]),
                    cell(a.asks),
                )
                for a in xid_recovery.RECOVERY_ACTIONS.values()
            ),
        ),
    ]
    return "\n".join(out)
