"""Named Llama-family model shapes: what the SFT workload trains and the MFU arithmetic counts.

The dimensions of the published models come from :data:`pytest_gpucluster.maths.metrics.KNOWN_SHAPES`
(the same numbers the MFU arithmetic uses, so a model and its FLOP count cannot disagree);
this module adds what a ``LlamaConfig`` also needs (RMSNorm epsilon, RoPE base) and the small
shapes that train in seconds on a CPU. Building a model of a shape is the rank side's job
(``workloads/sft_model.py``).

Standard library and `maths.metrics` only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pytest_gpucluster.maths.metrics import KNOWN_SHAPES, TransformerShape

__all__ = ["SHAPES", "ModelShape", "get_shape", "shape_of_config"]


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A named decoder shape: its dimensions and the two constants a Llama config adds."""

    name: str
    dims: TransformerShape
    """Width, depth, heads, MLP width, vocabulary; ``dims.seq_len`` is the context length."""
    rms_norm_eps: float
    rope_theta: float
    source: str
    """Where the numbers come from (the published ``config.json``), or why a CPU shape is so."""

    def with_layers(self, layers: int) -> ModelShape:
        """The same shape cut (or grown) to ``layers`` decoder blocks: a real width on one GPU."""
        if layers < 1:
            raise ValueError(f"a model needs at least one layer, got layers={layers}")
        dims = dataclasses.replace(self.dims, layers=layers)
        return dataclasses.replace(self, name=f"{self.name}[{layers} layers]", dims=dims)


def _published(name: str, eps: float, theta: float = 10000.0) -> ModelShape:
    return ModelShape(name, KNOWN_SHAPES[name], eps, theta, f"{name} published config.json")


SHAPES: dict[str, ModelShape] = {
    # LLaMA 1 used eps 1e-6; Llama 2 and 3 use 1e-5; Llama 3 moved the RoPE base to 500000.
    "llama-7b": _published("llama-7b", 1e-6),
    "llama-13b": _published("llama-13b", 1e-6),
    "llama2-7b": _published("llama2-7b", 1e-5),
    "llama2-13b": _published("llama2-13b", 1e-5),
    "llama2-70b": _published("llama2-70b", 1e-5),
    "llama3-8b": _published("llama3-8b", 1e-5, 500000.0),
    "llama3-70b": _published("llama3-70b", 1e-5, 500000.0),
    # CPU shapes. The vocabulary must hold the byte-level fallback tokenizer (260 ids).
    "tiny": ModelShape(
        "tiny",
        TransformerShape(
            hidden=128, layers=2, heads=4, kv_heads=4, intermediate=344, vocab=1000, seq_len=2048
        ),
        1e-5,
        10000.0,
        "CPU shape of FEASIBILITY.md §7 (about 0.7M parameters): a step takes milliseconds",
    ),
    "small": ModelShape(
        "small",
        TransformerShape(
            hidden=512, layers=4, heads=8, kv_heads=8, intermediate=1376, vocab=1000, seq_len=2048
        ),
        1e-5,
        10000.0,
        "CPU shape of about 14M parameters: compute, not overhead, dominates a step",
    ),
}


def get_shape(name: str) -> ModelShape:
    """The shape called ``name`` (``llama2-7b``, ``tiny``...); ValueError lists the known ones."""
    key = name.strip().lower().replace("_", "-")
    try:
        return SHAPES[key]
    except KeyError:
        raise ValueError(
            f"unknown model shape {name!r}; known shapes: {', '.join(SHAPES)} "
            "(or pass model_path, a local directory with a config.json)"
        ) from None


def shape_of_config(config: Any, seq_len: int | None = None) -> TransformerShape:
    """The :class:`TransformerShape` of a loaded Llama-style ``transformers`` config."""
    heads = int(config.num_attention_heads)
    return TransformerShape(
        hidden=int(config.hidden_size),
        layers=int(config.num_hidden_layers),
        heads=heads,
        kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        intermediate=int(config.intermediate_size),
        vocab=int(config.vocab_size),
        seq_len=int(seq_len or getattr(config, "max_position_embeddings", 2048)),
        tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
    )
