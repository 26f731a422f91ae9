"""The GPUs ``--hw=auto``'s provisional probe asks Slurm for, and the error when none are found.

Before there is a profile there is no GPU count to request, yet a step that requests no GPU gets
none: srun gives a step the job's GRES "except those implicitly requested when a job is
exclusive" (srun(1), ``--gres``), so in ``salloc --exclusive`` made without ``--gpus`` the probe
would see no GPU and ``--hw=auto`` would pick cpu-local for a GPU cluster. `probe_gpu_request`
asks for the nodes' GPUs instead, per node (``--gres=gpu:N``), from

1. ``SLURM_GPUS_ON_NODE`` — the GPUs the allocation was granted on each node, when it asked; else
2. ``scontrol show node -o``'s ``Gres=`` of the nodes — what each node has (the smallest count,
   since one ``--gres`` applies to every node of the step; a node with fewer is then named by the
   preflight, not hidden).

A request the site already put in ``--launcher-args`` wins (none is added). `no_gpu_error` is the
sentence for a multi-node Slurm cluster where the probe found no GPU: what was probed, how, and
what each node answered; never a silent cpu-local.

Only `probe_gpu_request` runs a tool (``scontrol``); the rest is pure. No pytest, no torch.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pytest_gpucluster.cluster.node_facts import ClusterFacts

__all__ = ["GpuRequest", "gres_gpu_count", "no_gpu_error", "node_gres", "probe_gpu_request"]

SITE_GPU_FLAGS = ("--gpus-per-node", "--gres", "--gpus", "--gpus-per-task", "-G", "--tres-per-task")
"""srun options that request GPUs: a site's own request in --launcher-args wins."""

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]

_GRES_ITEM = re.compile(r"^gpu(?::[^:(,]+)?:(\d+)")


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """What the probe's srun adds, and how that was decided (for the header and errors)."""

    args: tuple[str, ...]
    how: str


def gres_gpu_count(gres: str) -> int:
    """GPUs in a ``Gres=`` value: ``gpu:8``, ``gpu:h200:8(S:0-1)``, ``gpu:a100:4,gpu:h100:4``
    (summed), ``(null)`` or ``nic:2`` (0). ``gpu`` alone (no count) is one GPU, as Slurm reads it.

    >>> gres_gpu_count("gpu:h200:8(S:0-1),nic:1")
    8
    """
    total = 0
    for item in _split_gres(gres):
        if item == "gpu" or item.startswith("gpu:") or item.startswith("gpu("):
            match = _GRES_ITEM.match(item)
            total += int(match.group(1)) if match else 1
    return total


def _split_gres(gres: str) -> list[str]:
    """Items at commas outside parentheses (``gpu:8(S:0,1)`` is one item)."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(gres):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(gres[start:i].strip())
            start = i + 1
    items.append(gres[start:].strip())
    return [item for item in items if item]


def node_gres(text: str) -> dict[str, str]:
    """``node -> Gres value`` from ``scontrol show node -o`` (one node per line, ``Key=Value``)."""
    nodes: dict[str, str] = {}
    for line in text.splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        if "NodeName" in fields:
            nodes[fields["NodeName"]] = fields.get("Gres", "(null)")
    return nodes


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)


def probe_gpu_request(
    hosts: Sequence[str],
    launcher_args: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    *,
    scontrol: str = "scontrol",
    run: Runner = _run,
) -> GpuRequest:
    """The probe step's GPU request for ``hosts`` (see the module docstring)."""
    env = os.environ if environ is None else environ
    site = [a for a in launcher_args if a.split("=", 1)[0] in SITE_GPU_FLAGS]
    if site:
        return GpuRequest((), f"the GPU request in --launcher-args ({' '.join(site)})")
    granted = re.match(r"\s*(\d+)", env.get("SLURM_GPUS_ON_NODE", "") or "")
    if granted and int(granted.group(1)) > 0:
        count = int(granted.group(1))
        return GpuRequest(
            (f"--gres=gpu:{count}",), f"--gres=gpu:{count} (the allocation's SLURM_GPUS_ON_NODE)"
        )
    if shutil.which(scontrol) is None:
        return GpuRequest((), f"no GPU request ({scontrol} is not on PATH to read the nodes' Gres)")
    try:
        done = run([scontrol, "show", "node", "-o", ",".join(hosts)])
    except (OSError, subprocess.TimeoutExpired) as exc:
        return GpuRequest((), f"no GPU request ({scontrol} show node failed: {exc})")
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        return GpuRequest(
            (), f"no GPU request ({scontrol} show node said: {said[-1] if said else 'nothing'})"
        )
    gres = node_gres(done.stdout)
    counts = {host: gres_gpu_count(gres.get(host, gres.get(host.split(".")[0], ""))) for host in hosts}
    listed = ", ".join(f"{host} Gres={gres.get(host, '?')}" for host in hosts)
    if not any(counts.values()):
        return GpuRequest((), f"no GPU request (scontrol show node lists no gpu Gres: {listed})")
    count = min(c for c in counts.values() if c > 0)
    return GpuRequest(
        (f"--gres=gpu:{count}",), f"--gres=gpu:{count} (the nodes' Gres in scontrol show node: {listed})"
    )


def no_gpu_error(facts: ClusterFacts, probe_args: Sequence[str]) -> str | None:
    """``--hw=auto``'s error for a multi-node Slurm cluster whose probe found no GPU (None when a
    node lists one, or for a single node, which may be a CPU machine on purpose): which nodes were
    probed, by which job, with which GPU request, and what each node answered."""
    if len(facts.nodes) < 2 or any(node.gpu_count for node in facts.nodes):
        return None
    asked = [a for a in probe_args if a.split("=", 1)[0] in SITE_GPU_FLAGS]
    how = f"srun {' '.join(asked)}" if asked else "srun with no GPU request (the nodes' Gres lists no GPU)"
    said = "; ".join(facts.missing("cuda")) or "no node answered"
    hosts = ", ".join(node.host for node in facts.nodes)
    return (
        f"--hw=auto found no GPU on any of the {len(facts.nodes)} Slurm nodes {hosts}: the probe "
        f"({facts.source}) ran one task per node through {how}, and the nodes said: {said}. A multi-node "
        "Slurm cluster is not tested as cpu-local by default: check that a step sees the nodes' GPUs "
        "(srun --gres=gpu:N nvidia-smi), request them (--launcher-args='--gpus-per-node=N'), or pass "
        "--hw=<profile> (--hw=cpu-local to test the CPUs on purpose)."
    )
