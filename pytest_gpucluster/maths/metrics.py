"""The arithmetic behind every number the plugin reports: bus bandwidth, MFU, scaling, spreads.

Pure functions and frozen dataclasses over the standard library only. Rank-side workloads
import this module, so it must never import torch, pytest or anything else in this package.

Units are SI throughout: bytes, seconds, bytes per second, FLOP per second. nccl-tests prints
GB/s with 1 GB = 1e9 bytes, so ``busbw(...) / 1e9`` is the number in its ``busbw`` column.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "COLLECTIVES",
    "KNOWN_SHAPES",
    "MFU_FORMULAS",
    "Spread",
    "TransformerShape",
    "algbw",
    "bus_factor",
    "busbw",
    "mfu",
    "scaling_efficiency",
    "step_model_flops",
    "summarize",
]

# --------------------------------------------------------------------------------------------
# Bus bandwidth (nccl-tests doc/PERFORMANCE.md)
# --------------------------------------------------------------------------------------------

COLLECTIVES: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "alltoall",
    "sendrecv",
)
"""Collectives we know the bus-bandwidth factor of, named as nccl-tests names its binaries
without the ``_perf`` suffix."""


def bus_factor(collective: str, nranks: int) -> float:
    """The factor nccl-tests multiplies algorithm bandwidth by to get bus bandwidth.

    From nccl-tests ``doc/PERFORMANCE.md`` (and ``src/sendrecv.cu`` for sendrecv):

    ============== ============ =========================================================
    collective     factor       what ``size`` (the first column of nccl-tests) means
    ============== ============ =========================================================
    all_reduce     2(n-1)/n     the buffer on each rank (count * typesize)
    all_gather     (n-1)/n      the *total* gathered buffer = sendcount * n * typesize;
                                nccl-tests' ``count`` column is then the per-rank count
    reduce_scatter (n-1)/n      the *total* input buffer = recvcount * n * typesize;
                                ``count`` column is the per-rank count
    alltoall       (n-1)/n      each rank's whole send buffer (n chunks of count/n)
    broadcast      1            the buffer (the root sends all of it)
    reduce         1            the buffer (the root receives all of it)
    sendrecv       1            the buffer each rank sends to its peer
    ============== ============ =========================================================

    nccl-tests prints ``max(sendBytes, recvBytes)`` as the size, which is why the gathered or
    scattered total is the size for all_gather and reduce_scatter. With one rank the factor of
    the (n-1)/n family is 0, as nccl-tests prints ``busbw 0.00`` for a single GPU.
    (PERFORMANCE.md also gives (n-1)/(n+1) for all_reduce with in-network reduction — SHARP —
    which nccl-tests does not apply to its printed numbers; neither do we.)
    """
    if nranks < 1:
        raise ValueError(f"nranks must be at least 1, got {nranks}")
    n = nranks
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "alltoall"):
        return (n - 1) / n
    if collective in ("broadcast", "reduce", "sendrecv"):
        return 1.0
    raise ValueError(f"unknown collective {collective!r}; known collectives: {', '.join(COLLECTIVES)}")


def algbw(size_bytes: float, time_s: float) -> float:
    """Algorithm bandwidth in bytes/s: ``size / time`` (see :func:`bus_factor` for what size is)."""
    if time_s <= 0 or not math.isfinite(time_s):
        raise ValueError(f"time must be a positive number of seconds, got {time_s}")
    if size_bytes < 0:
        raise ValueError(f"size must be a non-negative number of bytes, got {size_bytes}")
    return size_bytes / time_s


def busbw(collective: str, size_bytes: float, time_s: float, nranks: int) -> float:
    """Bus bandwidth in bytes/s, comparable across rank counts and to the link's peak."""
    return algbw(size_bytes, time_s) * bus_factor(collective, nranks)


# --------------------------------------------------------------------------------------------
# Model FLOPs utilisation (PaLM, Chowdhery et al. 2022, appendix B)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TransformerShape:
    """The shape of a Llama-architecture decoder, enough to count its parameters and FLOPs.

    The parameter count assumes the Llama layout: no biases, RMSNorm with a weight only,
    a SwiGLU MLP with three ``hidden x intermediate`` matrices, grouped-query attention
    (``kv_heads`` <= ``heads``), rotary positions (no position-embedding table), and an
    output projection that is a separate matrix unless ``tied_embeddings``.
    """

    hidden: int
    """Model width (``hidden_size``)."""
    layers: int
    """Number of decoder blocks (``num_hidden_layers``)."""
    heads: int
    """Attention (query) heads (``num_attention_heads``); head dim = hidden / heads."""
    kv_heads: int
    """Key/value heads (``num_key_value_heads``); equal to ``heads`` without GQA."""
    intermediate: int
    """MLP width (``intermediate_size``)."""
    vocab: int
    """Vocabulary size."""
    seq_len: int
    """Training sequence length used when none is given to :meth:`flops_per_token`."""
    tied_embeddings: bool = False
    """Whether the output projection shares the input embedding matrix."""

    def __post_init__(self) -> None:
        for name in ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab", "seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"TransformerShape.{name} must be a positive integer, got {value!r}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder block."""
        kv_width = self.kv_heads * self.head_dim
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * kv_width  # q, o; k, v
        mlp = 3 * self.hidden * self.intermediate  # gate, up, down
        norms = 2 * self.hidden
        return attention + mlp + norms

    @property
    def embedding_params(self) -> int:
        """The input embedding table, plus the output projection when it is a separate matrix."""
        table = self.vocab * self.hidden
        return table if self.tied_embeddings else 2 * table

    @property
    def params(self) -> int:
        """Total parameters, as ``sum(p.numel() for p in model.parameters())`` reports them."""
        return self.layers * self.layer_params + self.hidden + self.embedding_params  # + final norm

    @property
    def matmul_params(self) -> int:
        """Parameters that take part in a matrix multiply for every token: N in 6N.

        That is every parameter except the input embedding table, whose use is a lookup and
        costs no FLOPs. The output projection stays in: it is a ``hidden x vocab`` matmul per
        token (for Llama 2 70B, 262M parameters, 0.4% of N). With tied embeddings the shared
        matrix is counted once, for its matmul use. PaLM's 6N counts matmul FLOPs; this is the
        N that makes 6N exactly the weight matmuls of a forward and a backward pass.
        """
        lookup_table = 0 if self.tied_embeddings else self.vocab * self.hidden
        return self.params - lookup_table

    def flops_per_token(self, seq_len: int | None = None, *, attention: bool = True) -> float:
        """Training FLOPs per token, PaLM appendix B: ``6N + 12·L·H·Q·T``.

        N is :attr:`matmul_params`; L layers, H heads, Q head dim, T the sequence length
        (``seq_len`` or the shape's own). The second term is the attention score and value
        matmuls (QK^T and AV), which have no parameters. Activation recomputation is *not*
        counted: that is MFU, not hardware FLOPs utilisation. ``attention=False`` gives the
        plain ``6N`` that many training frameworks print.
        """
        t = self.seq_len if seq_len is None else seq_len
        if t < 1:
            raise ValueError(f"seq_len must be a positive integer, got {t}")
        dense = 6.0 * self.matmul_params
        if not attention:
            return dense
        return dense + 12.0 * self.layers * self.heads * self.head_dim * t

    def attention_flops(self, lengths: Iterable[int]) -> float:
        """Training FLOPs of the attention score and value matmuls over sequences of these
        lengths: PaLM's per-token ``12·L·H·Q·T`` times the ``T`` tokens of each, ``Σ 12·L·H·Q·t²``."""
        return 12.0 * self.layers * self.heads * self.head_dim * sum(float(t) * t for t in lengths)


MFU_FORMULAS = {
    "padded": "PaLM: (6N + 12*L*H*Q*T) x processed tokens (padding included), T = seq_len",
    "real": "6N x processed tokens + 12*L*H*Q * sum(t^2) over each sequence's real length t "
    "(flash_attention_2 skips padding, so attention FLOPs count real tokens only)",
}
"""How the model FLOPs behind MFU were counted (the name the report and the check's hint give)."""


def step_model_flops(
    shape: TransformerShape,
    processed_tokens: int,
    seq_len: int,
    real_lengths: Sequence[int],
    *,
    skips_padding: bool,
) -> tuple[float, str]:
    """Model FLOPs of the sequences a device trained on, and which formula (:data:`MFU_FORMULAS`).

    The dense ``6N`` term is counted per processed token, padding included (the weight matmuls run
    over every position of the padded batch). The attention term is counted over the padded length
    ``seq_len`` unless the attention implementation skips padding (``flash_attention_2`` unpads
    each sequence): then over each sequence's real length. Counting padded attention for a kernel
    that never computes it overstates MFU: for Llama 7B at 2048 tokens the padded attention term
    is 7.5% of the count, so with Alpaca's ~88% padding MFU reads ~8% high (relative)."""
    dense = 6.0 * shape.matmul_params * processed_tokens
    if skips_padding:
        return dense + shape.attention_flops(real_lengths), "real"
    return dense + shape.attention_flops([seq_len] * len(real_lengths)), "padded"


KNOWN_SHAPES: dict[str, TransformerShape] = {
    # Values from each model's published config.json.
    "llama-7b": TransformerShape(4096, 32, 32, 32, 11008, 32000, 2048),
    "llama-13b": TransformerShape(5120, 40, 40, 40, 13824, 32000, 2048),
    "llama2-7b": TransformerShape(4096, 32, 32, 32, 11008, 32000, 4096),
    "llama2-13b": TransformerShape(5120, 40, 40, 40, 13824, 32000, 4096),
    "llama2-70b": TransformerShape(8192, 80, 64, 8, 28672, 32000, 4096),
    "llama3-8b": TransformerShape(4096, 32, 32, 8, 14336, 128256, 8192),
    "llama3-70b": TransformerShape(8192, 80, 64, 8, 28672, 128256, 8192),
}


def mfu(tokens_per_s_per_device: float, flops_per_token: float, peak_flops: float) -> float:
    """Model FLOPs utilisation as a fraction (0.336, not 33.6).

    ``peak_flops`` is the device's *dense* peak for the training dtype (989e12 for H100/H800
    BF16), never the sparse datasheet figure.
    """
    if peak_flops <= 0:
        raise ValueError(f"peak FLOP/s must be positive, got {peak_flops}")
    if tokens_per_s_per_device < 0 or flops_per_token < 0:
        raise ValueError("tokens per second and FLOPs per token must not be negative")
    return tokens_per_s_per_device * flops_per_token / peak_flops


# --------------------------------------------------------------------------------------------
# Scaling
# --------------------------------------------------------------------------------------------


def scaling_efficiency(throughput_n: float, n: float, throughput_base: float, n_base: float) -> float:
    """Weak-scaling efficiency: ``throughput(N) / ((N / N0) * throughput(N0))``.

    Throughputs are whole-job rates (samples/s, tokens/s) at N and N0 nodes (or GPUs; the
    same unit for both). 1.0 is perfect linear scaling; 0.93 means 7% was lost going from N0
    to N.
    """
    if n <= 0 or n_base <= 0:
        raise ValueError(f"node counts must be positive, got n={n}, n_base={n_base}")
    if throughput_base <= 0:
        raise ValueError(f"the base throughput must be positive, got {throughput_base}")
    return throughput_n / ((n / n_base) * throughput_base)


# --------------------------------------------------------------------------------------------
# Spread of repeated measurements
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Spread:
    """A summary of repeated measurements of one quantity."""

    median: float
    p90: float
    """90th percentile, linear interpolation between order statistics (numpy's default)."""
    min: float
    max: float
    mad: float
    """Median absolute deviation from the median, unscaled (multiply by 1.4826 for a sigma)."""
    n: int


def summarize(values: Iterable[float]) -> Spread:
    """Median, p90, min, max and MAD of a non-empty series; NaN values are refused."""
    data = sorted(float(v) for v in values)
    if not data:
        raise ValueError("cannot summarize an empty series of measurements")
    if any(math.isnan(v) for v in data):
        raise ValueError("cannot summarize a series that contains NaN")
    median = statistics.median(data)
    p90 = statistics.quantiles(data, n=10, method="inclusive")[8] if len(data) > 1 else data[0]
    mad = statistics.median(abs(v - median) for v in data)
    return Spread(median=median, p90=p90, min=data[0], max=data[-1], mad=mad, n=len(data))
