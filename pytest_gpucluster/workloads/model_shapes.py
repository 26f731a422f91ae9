"""Named Llama-family model shapes for the SFT workload, and building a model of one.

The dimensions of the published models come from :data:`pytest_gpucluster.metrics.KNOWN_SHAPES`
(the same numbers the MFU arithmetic uses, so a model and its FLOP count cannot disagree);
this module adds what a ``LlamaConfig`` also needs (RMSNorm epsilon, RoPE base) and the small
shapes that train in seconds on a CPU.

Rank-side module: the standard library, ``metrics`` and, lazily, torch, ``transformers`` and
DeepSpeed only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_gpucluster.metrics import KNOWN_SHAPES, TransformerShape

__all__ = ["SHAPES", "ModelShape", "build_model", "get_shape", "shape_of_config"]


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

    def llama_config(self, **overrides: Any) -> Any:
        """A ``transformers.LlamaConfig`` of this shape (``overrides`` win)."""
        from transformers import LlamaConfig

        d = self.dims
        kwargs: dict[str, Any] = {
            "vocab_size": d.vocab,
            "hidden_size": d.hidden,
            "intermediate_size": d.intermediate,
            "num_hidden_layers": d.layers,
            "num_attention_heads": d.heads,
            "num_key_value_heads": d.kv_heads,
            "max_position_embeddings": d.seq_len,
            "rms_norm_eps": self.rms_norm_eps,
            # transformers 5 folds rope_theta into rope_parameters; 4.x takes it as is.
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": d.tied_embeddings,
            "use_cache": False,
        }
        kwargs.update(overrides)
        return LlamaConfig(**kwargs)


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


def build_model(
    *,
    shape: str,
    path: str | None,
    layers: int | None,
    precision: str,
    attn_implementation: str,
    device: str,
    zero3_config: dict[str, Any] | None,
    gradient_checkpointing: bool,
) -> tuple[Any, TransformerShape, str]:
    """A causal LM to train: the model, the shape its FLOPs are counted with, its name for people.

    From the local checkpoint at ``path`` when given (never downloaded), else a random-weight
    Llama of the named ``shape`` (cut to ``layers``), made directly on ``device`` in the
    training dtype. With ``zero3_config`` (a ZeRO-3 DeepSpeed config) the model is built
    partitioned across the ranks instead, so that it never exists whole on one device.
    """
    import torch
    import transformers

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    major, minor = (int(p) for p in transformers.__version__.split(".")[:2])
    kwargs: dict[str, Any] = {
        ("dtype" if (major, minor) >= (4, 56) else "torch_dtype"): dtype,
        "attn_implementation": attn_implementation,
    }
    if path:
        if not (Path(path) / "config.json").is_file():
            raise ValueError(f"SFT option model_path={path!r} is not a directory with a config.json")
        keep_alive = _hf_zero3_context(zero3_config) if zero3_config else None
        # Loaded where transformers puts it; deepspeed.initialize moves (or partitions) it.
        model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True, **kwargs)
        del keep_alive
        dims, label = shape_of_config(model.config), str(path)
    else:
        named = get_shape(shape)
        if layers:
            named = named.with_layers(layers)
        config = named.llama_config()
        if zero3_config:
            model = _zero3_random_model(config, zero3_config, dtype, kwargs)
        else:
            with torch.device(device):
                model = transformers.LlamaForCausalLM._from_config(config, **kwargs)
        dims, label = named.dims, named.name
    model.config.use_cache = False
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, dims, label


def _hf_zero3_context(ds_config: dict[str, Any]) -> Any:
    """transformers' ZeRO-3 loading (partitioned while loading); it needs the accelerate package."""
    try:
        from transformers.integrations import HfDeepSpeedConfig

        return HfDeepSpeedConfig(ds_config)
    except ImportError:  # without accelerate: load whole, deepspeed.initialize partitions it
        return None


def _zero3_random_model(config: Any, ds_config: dict[str, Any], dtype: Any, kwargs: dict[str, Any]) -> Any:
    """A random-weight model built inside ``deepspeed.zero.Init``.

    Parameters are partitioned as each module is made, so transformers' own initialisation
    sees empty shards (and transformers' ZeRO-3 path needs the accelerate package). Each
    module's weights are gathered and initialised as transformers does for Llama:
    normal(0, initializer_range) matrices, RMSNorm weights 1; rank 0's values are kept.
    """
    import deepspeed
    import transformers

    with deepspeed.zero.Init(config_dict_or_path=ds_config, dtype=dtype):
        model = transformers.LlamaForCausalLM._from_config(config, **kwargs)
    std = float(getattr(config, "initializer_range", 0.02))
    for module in model.modules():
        params = list(module.parameters(recurse=False))
        if not params:
            continue
        with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
            if deepspeed.comm.get_rank() == 0:
                for param in params:
                    if param.dim() >= 2:
                        param.data.normal_(0.0, std)
                    else:
                        param.data.fill_(1.0)
    return model
