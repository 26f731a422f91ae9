"""Building the model an SFT job trains: a random-weight Llama of a named shape, or a local checkpoint.

Rank-side module (``workloads/``): the standard library, `maths` and, lazily, torch,
``transformers`` and DeepSpeed only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_gpucluster.maths.metrics import TransformerShape
from pytest_gpucluster.maths.shapes import ModelShape, get_shape, shape_of_config

__all__ = ["build_model", "llama_config"]


def llama_config(shape: ModelShape, **overrides: Any) -> Any:
    """A ``transformers.LlamaConfig`` of ``shape`` (``overrides`` win)."""
    from transformers import LlamaConfig

    d = shape.dims
    kwargs: dict[str, Any] = {
        "vocab_size": d.vocab,
        "hidden_size": d.hidden,
        "intermediate_size": d.intermediate,
        "num_hidden_layers": d.layers,
        "num_attention_heads": d.heads,
        "num_key_value_heads": d.kv_heads,
        "max_position_embeddings": d.seq_len,
        "rms_norm_eps": shape.rms_norm_eps,
        # transformers 5 folds rope_theta into rope_parameters; 4.x takes it as is.
        "rope_theta": shape.rope_theta,
        "tie_word_embeddings": d.tied_embeddings,
        "use_cache": False,
    }
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


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
        config = llama_config(named)
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
