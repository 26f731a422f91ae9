"""What a GPU session's machine has, read once before anything runs (`gpu_session.sh`'s first step).

The device image holds torch and most of what the suite needs, but not every package (DeepSpeed,
pydantic, hjson travel as wheels: `gpu_session_wheels.sh`). A missing one would otherwise show up
minutes later as a failed job; here every import is tried up front and what is missing is said in
one line. Also records the versions the figures depend on (torch, CUDA, NCCL, the GPU and its SM
count) as JSON for `gpu_summary.py`.

    python3 benchmarks/gpu_facts.py --json FILE

Exit status 0 when every package the steps need imports, 3 when one the whole session needs
(torch, pytest, pydantic, yaml, the plugin) does not: then no step can run. Imports nothing from
``pytest_gpucluster`` at module level (whether it imports is one of the questions).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import platform
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ESSENTIAL = ("torch", "pytest", "pydantic", "yaml", "pytest_gpucluster")
"""Without any of these no step runs."""
WANTED = ("deepspeed", "transformers", "hjson", "xdist", "numpy", "matplotlib")
"""Without these some steps fail (SFT needs DeepSpeed and transformers; the report's plots matplotlib)."""


@dataclass(frozen=True, slots=True)
class Import:
    module: str
    version: str | None
    path: str | None
    error: str | None


def try_import(module: str) -> Import:
    """Import one module; its version and where it came from, or the error in one line."""
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # any failure to import is the answer, not a crash
        return Import(module, None, None, f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
    version = getattr(mod, "__version__", None) or getattr(mod, "VERSION", None)
    return Import(module, str(version) if version is not None else None, getattr(mod, "__file__", None), None)


def torch_facts() -> dict[str, Any]:
    """torch's CUDA build, the devices it sees and NCCL's version (empty where torch is missing)."""
    try:
        import torch
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    facts: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "cuda_available": bool(torch.cuda.is_available()),
        "devices": [],
        "nccl": None,
        "cudnn": None,
    }
    if facts["cuda_available"]:
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            facts["devices"].append(
                {
                    "name": props.name,
                    "capability": f"{props.major}.{props.minor}",
                    "sm_count": props.multi_processor_count,
                    "memory_bytes": props.total_memory,
                }
            )
        try:
            facts["nccl"] = ".".join(str(part) for part in torch.cuda.nccl.version())
        except Exception as exc:
            facts["nccl"] = f"unknown ({type(exc).__name__}: {exc})"
        facts["cudnn"] = torch.backends.cudnn.version()
    return facts


def plugin_registered() -> bool:
    """Whether pytest will load the plugin by itself (its pytest11 entry point is installed)."""
    return any(
        ep.value.startswith("pytest_gpucluster") for ep in importlib.metadata.entry_points(group="pytest11")
    )


def missing_line(imports: Sequence[Import]) -> str:
    missing = [i for i in imports if i.error is not None]
    if not missing:
        return "imports: every package the session needs is there"
    return "imports: MISSING " + "; ".join(f"{i.module} ({i.error})" for i in missing)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True, help="write the facts here")
    args = parser.parse_args(argv)
    imports = [try_import(name) for name in (*ESSENTIAL, *WANTED)]
    facts = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "imports": [asdict(i) for i in imports],
        "missing": [i.module for i in imports if i.error is not None],
        "plugin_entry_point": plugin_registered(),
        "torch": torch_facts(),
    }
    args.json.write_text(json.dumps(facts, indent=1))
    print(missing_line(imports))
    present = ", ".join(f"{i.module} {i.version or '?'}" for i in imports if i.error is None)
    print(f"versions: python {facts['python']}; {present}")
    t = facts["torch"]
    if "error" not in t:
        gpus = "; ".join(
            f"{d['name']} (cc {d['capability']}, {d['sm_count']} SMs, {d['memory_bytes'] / 2**30:.0f} GiB)"
            for d in t["devices"]
        )
        print(
            f"torch {t['torch']}, CUDA build {t['cuda_build']}, CUDA available {t['cuda_available']},"
            f" NCCL {t['nccl']}, GPUs: {gpus or 'none'}"
        )
    if not facts["plugin_entry_point"]:
        print(
            "plugin: no pytest11 entry point installed (the project's wheel was not carried): pytest gets -p"
        )
    return 3 if any(i.error for i in imports if i.module in ESSENTIAL) else 0


if __name__ == "__main__":
    sys.exit(main())
