"""The arithmetic of the numerics check, on one device: which dtypes, the chain, its digest, and
the small known-answer problem.

- :func:`select_dtypes` picks what the device supports: on a CPU fp32 and bf16; on a GPU fp32 with
  TF32 off (``fp32``) and on (``tf32``, compute capability 8.0+), bf16 (8.0+), fp16, and fp8
  (e4m3 inputs, ``torch._scaled_mm``, compute capability 8.9+ and a torch that has both).
- :func:`chain` runs ``depth`` GEMMs ``x = x @ b`` of ``n x n`` inputs made on the device from a
  seed (``b`` scaled by 1/sqrt(n) so every step keeps unit variance), then row sums in fp32.
- :func:`digest` folds the output's bits on the device (every 16-bit word times an odd weight,
  summed per row in int64: exact, so any order gives the same sum and any single flipped bit changes
  it) and hashes the folded rows and the row sums on the host: a few KiB cross the PCIe bus, not
  the matrix.
- :func:`known_answer` runs one small GEMM and its row sums against float64 on the host, as a
  ratio of the error to the classical a-priori bound of a dot product of length K in floating
  point (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §3.1: ``|fl(x.y) - x.y|
  <= gamma_K |x|.|y|``, ``gamma_K = K u / (1 - K u)``; any summation order, split-K and tree
  reductions included), with ``u`` the unit roundoff of the dtype's accumulation, plus the rounding
  of the inputs (TF32) and of the output. A ratio above 1 is a wrong answer, not noise.

Rank-side: standard library and torch only (torch passed in, imported by the caller).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DTYPES",
    "DTypeSpec",
    "chain",
    "chain_inputs",
    "digest",
    "flip_bit",
    "known_answer",
    "select_dtypes",
]


@dataclass(frozen=True, slots=True)
class DTypeSpec:
    """One dtype of the check: how its inputs are stored, how its GEMM runs, and its unit roundoffs."""

    name: str
    storage: str
    """The torch dtype of the inputs (``float32`` for fp32 and tf32)."""
    u_in: float
    """Rounding of the inputs inside the GEMM (TF32's 10-bit mantissa); 0 where the reference
    starts from the very values the GEMM reads."""
    u_acc: float
    """Unit roundoff of the accumulation, worst case: fp16/bf16 GEMMs may reduce in reduced precision
    (torch's ``allow_*_reduced_precision_reduction``), fp8 tensor cores keep fewer bits than fp32."""
    u_out: float
    """Rounding of the output (fp8's output is bf16)."""
    min_capability: tuple[int, int] = (0, 0)
    """The CUDA compute capability its tensor-core path needs."""


DTYPES: dict[str, DTypeSpec] = {
    "fp32": DTypeSpec("fp32", "float32", 0.0, 2.0**-24, 2.0**-24),
    "tf32": DTypeSpec("tf32", "float32", 2.0**-11, 2.0**-24, 2.0**-24, (8, 0)),
    "bf16": DTypeSpec("bf16", "bfloat16", 0.0, 2.0**-8, 2.0**-8, (8, 0)),
    "fp16": DTypeSpec("fp16", "float16", 0.0, 2.0**-11, 2.0**-11),
    "fp8": DTypeSpec("fp8", "float8_e4m3fn", 0.0, 2.0**-8, 2.0**-8, (8, 9)),
}
CPU_DEFAULT = ("fp32", "bf16")
GPU_DEFAULT = ("fp32", "tf32", "bf16", "fp16", "fp8")


def select_dtypes(
    is_cuda: bool,
    capability: tuple[int, int] | None,
    has_fp8: bool,
    requested: Sequence[str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The dtypes this device runs, in order, and why each other asked-for dtype does not run.

    ``requested`` (the profile's ``numerics.dtypes``) replaces the device's default list; on a CPU
    it may name GPU dtypes too (fp16 and fp8 run there, slowly: the tests use that)."""
    names = list(requested) if requested else list(GPU_DEFAULT if is_cuda else CPU_DEFAULT)
    run: list[str] = []
    skipped: dict[str, str] = {}
    for name in names:
        spec = DTYPES.get(name)
        if spec is None:
            skipped[name] = f"unknown dtype {name!r} (known: {', '.join(DTYPES)})"
        elif name == "fp8" and not has_fp8:
            skipped[name] = "this torch has no float8_e4m3fn or _scaled_mm"
        elif is_cuda and capability is not None and capability < spec.min_capability:
            need = ".".join(map(str, spec.min_capability))
            have = ".".join(map(str, capability))
            skipped[name] = f"{name} tensor cores need compute capability {need}+, this GPU is {have}"
        else:
            run.append(name)
    return run, skipped


def has_fp8(torch: Any) -> bool:
    return hasattr(torch, "float8_e4m3fn") and hasattr(torch, "_scaled_mm")


def _storage(torch: Any, spec: DTypeSpec) -> Any:
    return getattr(torch, spec.storage)


def chain_inputs(torch: Any, spec: DTypeSpec, n: int, seed: int, device: str) -> tuple[Any, Any]:
    """``a`` (n x n, unit normal) and ``b`` (n x n, normal / sqrt(n)) made on ``device`` from
    ``seed`` and cast to the dtype: every rank of one part makes the same bits without moving them.
    fp8's ``b`` is column-major, as ``_scaled_mm`` wants its second operand."""
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    a = torch.randn(n, n, generator=gen, device=device, dtype=torch.float32)
    b = torch.randn(n, n, generator=gen, device=device, dtype=torch.float32) / math.sqrt(n)
    a, b = a.to(_storage(torch, spec)), b.to(_storage(torch, spec))
    if spec.name == "fp8":
        b = b.t().contiguous().t()
    return a, b


def matmul_fn(torch: Any, spec: DTypeSpec, device: str) -> Callable[[Any, Any], Any]:
    """``(x, b) -> x @ b`` in the dtype: fp8 through ``_scaled_mm`` with unit scales into bf16."""
    if spec.name != "fp8":
        return torch.mm
    one = torch.ones((), dtype=torch.float32, device=device)

    def scaled(x: Any, b: Any) -> Any:
        return torch._scaled_mm(x, b, one, one, out_dtype=torch.bfloat16)

    return scaled


def chain(torch: Any, spec: DTypeSpec, a: Any, b: Any, depth: int, device: str) -> tuple[Any, Any]:
    """``depth`` GEMMs ``x = x @ b`` from ``x = a`` (fp8: each product, bf16, cast back to fp8 for
    the next), then the fp32 row sums of the last product: ``(output, row_sums)``."""
    mm = matmul_fn(torch, spec, device)
    x = a
    out = a
    for step in range(depth):
        out = mm(x, b)
        x = out.to(_storage(torch, spec)) if spec.name == "fp8" and step < depth - 1 else out
    return out, out.float().sum(dim=1)


def flip_bit(torch: Any, tensor: Any, bit: int = 0) -> None:
    """Flip bit ``bit`` of the first byte of ``tensor`` in place (little-endian: bit 0 is the lowest
    mantissa bit of the first element, the subtlest corruption there is)."""
    raw = tensor.view(-1).view(torch.uint8)
    raw[0] = raw[0] ^ (1 << int(bit))


_FOLD_ROWS = 256


def _fold(torch: Any, x: Any) -> Any:
    """Per row: sum of every 16-bit word (as 0..65535) times an odd weight below 2^31, in int64.

    No sum can overflow (65535 x 2^31 x 2^15 words < 2^63), so the sums are exact whatever the
    order; a single flipped bit moves one word by 2^b and its row's sum by 2^b times an odd
    weight, never by zero."""
    words = x.contiguous().view(x.shape[0], -1).view(torch.int16)
    cols = words.shape[1]
    if cols > 1 << 15:
        raise ValueError(f"rows of {cols} 16-bit words would overflow the fold (at most 32768)")
    weights = ((torch.arange(cols, dtype=torch.int64) * 2654435761) % (1 << 31)) | 1
    weights = weights.to(x.device)
    sums = [((rows.to(torch.int64) & 0xFFFF) * weights).sum(dim=1) for rows in words.split(_FOLD_ROWS, dim=0)]
    return torch.cat(sums)


def _host_bytes(torch: Any, tensor: Any) -> bytes:
    raw = tensor.detach().to("cpu").contiguous().view(-1).view(torch.uint8)
    try:
        return raw.numpy().tobytes()  # torch's wheels bring numpy; without it, the slow way
    except (ImportError, RuntimeError):
        return bytes(raw.tolist())


def digest(torch: Any, output: Any, row_sums: Any) -> str:
    """Hex digest of the output's bits (folded on the device) and of its fp32 row sums."""
    h = hashlib.sha256()
    h.update(str(output.dtype).encode())
    h.update(_host_bytes(torch, _fold(torch, output)))
    h.update(_host_bytes(torch, row_sums.float()))
    return h.hexdigest()[:32]


def _gamma(k: int, u: float) -> float:
    ku = k * u
    if ku >= 1:
        raise ValueError(f"K u = {ku:g} >= 1: the bound says nothing; use a smaller known_answer_k")
    return ku / (1 - ku)


def known_answer(torch: Any, spec: DTypeSpec, k: int, seed: int, device: str) -> dict[str, Any]:
    """One ``k x k`` GEMM and its fp32 row sums against float64 on the host: the largest error as a
    fraction of its bound (``ratio``, at most 1 when the answer is right), for the GEMM and for
    the row sums, and the element where the GEMM's was largest."""
    a32 = torch.randn(k, k, generator=torch.Generator(device=device).manual_seed(seed), device=device)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    b32 = torch.randn(k, k, generator=gen, device=device) / math.sqrt(k)
    a, b = a32.to(_storage(torch, spec)), b32.to(_storage(torch, spec))
    if spec.name == "fp8":
        b = b.t().contiguous().t()
    out = matmul_fn(torch, spec, device)(a, b)
    sums = out.float().sum(dim=1)
    # The reference reads what the GEMM read: the cast inputs, except TF32, which rounds inside.
    ref_a = (a32 if spec.name == "tf32" else a).to("cpu", torch.float64)
    ref_b = (b32 if spec.name == "tf32" else b).to("cpu", torch.float64)
    exact = ref_a @ ref_b
    magnitude = ref_a.abs() @ ref_b.abs()
    c = out.to("cpu", torch.float64)
    bound = (_gamma(k, spec.u_acc) + 2 * spec.u_in + spec.u_in**2) * magnitude + spec.u_out * exact.abs()
    gemm = ((c - exact).abs() / bound.clamp_min(1e-300)).flatten()
    worst = int(gemm.argmax())
    # The row sums accumulate the GEMM's own output in fp32 (torch's accumulation type for every
    # floating dtype here) and are rounded to fp32.
    u32 = 2.0**-24
    row_exact = c.sum(dim=1)
    row_bound = _gamma(k, u32) * c.abs().sum(dim=1) + u32 * row_exact.abs()
    rows = (sums.to("cpu", torch.float64) - row_exact).abs() / row_bound.clamp_min(1e-300)
    return {
        "k": k,
        "ratio": max(float(gemm.max()), float(rows.max())),
        "gemm_ratio": float(gemm.max()),
        "row_sum_ratio": float(rows.max()),
        "worst": {
            "row": worst // k,
            "col": worst % k,
            "got": float(c.flatten()[worst]),
            "float64": float(exact.flatten()[worst]),
            "bound": float(bound.flatten()[worst]),
        },
        "u": {"in": spec.u_in, "acc": spec.u_acc, "out": spec.u_out},
    }
