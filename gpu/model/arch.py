"""One description per architecture: what the loader checks, the reference computes and the
engine builds. Nothing else branches on an architecture's name.

    arch = ARCHITECTURES["qwen2"]     # rope="neox", qkv_bias=True, ...
    config = read_config(path, metadata, tensor_names)

Every architecture here is a pre-norm decoder with grouped-query attention and a gated MLP:

    x   = embed[token] * (sqrt(d_model) if embed_scale)
    h   = rmsnorm(x) * attn_norm
    q,k,v = h @ Wq,Wk,Wv (+ biases if qkv_bias)
    q,k = rmsnorm per head * attn_q_norm, attn_k_norm     if qk_norm
    q,k = rope(q, k)        adjacent pairs (ggml mode 0) or halves ("neox")
    a   = attention(q, K, V) @ Wo           causal; a sliding window on local layers
    x  += rmsnorm(a) * post_attention_norm  if post_norms, else a
    h   = rmsnorm(x) * ffn_norm
    f   = (act(h @ Wgate) * (h @ Wup)) @ Wdown       act = silu or gelu (tanh form)
    x  += rmsnorm(f) * post_ffw_norm         if post_norms, else f
    logits = rmsnorm(x) * output_norm @ Wout (the embedding when there is no output.weight)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import msgspec
import numpy as np

from runtime.errors import ModelFormatError, UnsupportedModelError


class Architecture(msgspec.Struct, frozen=True):
    name: str
    rope: Literal["adjacent", "neox"] = "adjacent"
    qkv_bias: bool = False
    qk_norm: bool = False
    post_norms: bool = False
    activation: Literal["silu", "gelu"] = "silu"
    embed_scale: bool = False
    # Sliding-window attention: every swa_pattern-th layer is global, the others local, with
    # their own RoPE base. llama.cpp fixes both for Gemma 3 when the file does not say.
    swa_pattern: int = 0
    swa_rope_base: float = 10000.0

    def layer_tensors(self) -> tuple[str, ...]:
        """Per-layer tensor names (after 'blk.N.'), each ending in .weight or .bias."""
        names = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                 "ffn_gate", "ffn_up", "ffn_down"]  # fmt: skip
        if self.qk_norm:
            names += ["attn_q_norm", "attn_k_norm"]
        if self.post_norms:
            names += ["post_attention_norm", "post_ffw_norm"]
        out = [f"{n}.weight" for n in names]
        if self.qkv_bias:
            out += ["attn_q.bias", "attn_k.bias", "attn_v.bias"]
        return tuple(out)


ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in (
        Architecture("llama"),
        Architecture("qwen2", rope="neox", qkv_bias=True),
        Architecture("qwen3", rope="neox", qk_norm=True),
        Architecture("gemma3", rope="neox", qk_norm=True, post_norms=True, activation="gelu", embed_scale=True, swa_pattern=6),  # fmt: skip
    )
}


class ModelConfig(msgspec.Struct, frozen=True):
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    rope_base: float
    norm_eps: float
    context_length: int
    arch: Architecture = ARCHITECTURES["llama"]
    sliding_window: int = 0  # positions a local layer sees (itself included); 0 = none
    rope_factors: tuple[float, ...] | None = None  # Llama 3 frequency divisors (rope_freqs.weight)
    rope_linear_scale: float = 1.0  # linear RoPE scaling factor

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def group_size(self) -> int:
        """Query heads per KV head (grouped-query attention)."""
        return self.n_heads // self.n_kv_heads

    def is_local(self, layer: int) -> bool:
        """True for a sliding-window layer."""
        p = self.arch.swa_pattern
        return bool(p and self.sliding_window and (layer + 1) % p)

    def window(self, layer: int) -> int:
        """How many positions (the query's own included) layer `layer` attends to; 0 = all."""
        return self.sliding_window if self.is_local(layer) else 0

    def inv_freq(self, layer: int) -> np.ndarray:
        """RoPE angle per position for each rotated pair i: base^(-2i/head_dim), scaled (float64)."""
        base = self.arch.swa_rope_base if self.is_local(layer) else self.rope_base
        inv = base ** (-np.arange(0, self.head_dim, 2, dtype=np.float64) / self.head_dim)
        if not self.is_local(layer):  # llama.cpp applies scaling to the global layers only
            if self.rope_factors is not None:
                inv = inv / np.asarray(self.rope_factors, np.float64)
            inv = inv / self.rope_linear_scale
        return inv


def architecture(path: Path, metadata: dict[str, object]) -> Architecture:
    name = metadata.get("general.architecture")
    if name is None:
        raise ModelFormatError(f"{path}: metadata key 'general.architecture' is missing")
    if name not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"{path}: architecture {name!r} is not supported: slotswarm has no description of its "
            f"layers (supported: {', '.join(ARCHITECTURES)})"
        )
    return ARCHITECTURES[str(name)]


def read_config(path: Path, md: dict[str, object], tensors: dict) -> ModelConfig:
    """The model's shape from its `<arch>.*` metadata keys (and rope_freqs.weight, if present)."""
    arch = architecture(path, md)
    a = arch.name

    def need(key: str) -> object:
        if f"{a}.{key}" not in md:
            raise ModelFormatError(f"{path}: metadata key '{a}.{key}' is missing")
        return md[f"{a}.{key}"]

    def integer(key: str, default: int | None = None) -> int:
        value = md.get(f"{a}.{key}", default) if default is not None else need(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ModelFormatError(f"{path}: metadata key '{a}.{key}' = {value!r} is not a positive integer")
        return value

    def number(key: str, default: float | None = None) -> float:
        value = md.get(f"{a}.{key}", default) if default is not None else need(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise ModelFormatError(f"{path}: metadata key '{a}.{key}' = {value!r} is not a number")
        return float(value)

    if f"{a}.expert_count" in md and md[f"{a}.expert_count"]:
        raise UnsupportedModelError(f"{path}: mixture-of-experts layers ({a}.expert_count) are not supported")
    d_model = integer("embedding_length")
    n_heads = integer("attention.head_count")
    n_kv_heads = integer("attention.head_count_kv", n_heads)
    if n_heads % n_kv_heads:
        raise ModelFormatError(f"{path}: {n_heads} heads is not a multiple of {n_kv_heads} KV heads")
    if f"{a}.attention.key_length" not in md and d_model % n_heads:
        raise ModelFormatError(f"{path}: {n_heads} heads do not divide d_model {d_model}")
    head_dim = integer("attention.key_length", d_model // n_heads)
    if integer("attention.value_length", head_dim) != head_dim:
        raise UnsupportedModelError(f"{path}: value heads narrower or wider than key heads are not supported")
    rope_dims = md.get(f"{a}.rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        raise UnsupportedModelError(f"{path}: partial RoPE ({rope_dims} of {head_dim} head dims) is not supported")
    linear = 1.0
    scaling = md.get(f"{a}.rope.scaling.type", "none")
    if scaling == "linear":
        linear = number("rope.scaling.factor")
    elif scaling != "none":
        raise UnsupportedModelError(f"{path}: RoPE scaling {scaling!r} is not supported (only linear and Llama 3's)")
    factors = None
    if "rope_freqs.weight" in tensors:
        factors = tuple(float(f) for f in tensors["rope_freqs.weight"].dequantize().reshape(-1))
        if len(factors) != head_dim // 2:
            raise ModelFormatError(f"{path}: rope_freqs.weight has {len(factors)} factors, expected {head_dim // 2}")
    if f"{a}.vocab_size" in md:
        vocab_size = integer("vocab_size")
    elif "tokenizer.ggml.tokens" in md:
        vocab_size = len(md["tokenizer.ggml.tokens"])  # type: ignore[arg-type]
    else:
        raise ModelFormatError(f"{path}: metadata key 'tokenizer.ggml.tokens' is missing")
    n_layers = integer("block_count")
    if n_layers > len(tensors):  # each layer has tensors of its own; a corrupt count must not build a huge table
        raise ModelFormatError(f"{path}: metadata key '{a}.block_count' = {n_layers} but the file holds {len(tensors)} tensors")
    return ModelConfig(
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        d_ff=integer("feed_forward_length"),
        vocab_size=vocab_size,
        rope_base=number("rope.freq_base", 10000.0),
        norm_eps=number("attention.layer_norm_rms_epsilon"),
        context_length=integer("context_length"),
        arch=arch,
        sliding_window=(integer("attention.sliding_window", 0) if md.get(f"{a}.attention.sliding_window") else 0)
        if arch.swa_pattern
        else 0,
        rope_factors=factors,
        rope_linear_scale=linear,
    )


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(rows, cols) of every tensor the model must have; vectors are (1, n).
    output.weight is optional (absent = tied to token_embd) and not listed."""
    c = config
    shapes = {"token_embd.weight": (c.vocab_size, c.d_model), "output_norm.weight": (1, c.d_model)}
    per_layer = {
        "attn_norm.weight": (1, c.d_model),
        "attn_q.weight": (c.q_dim, c.d_model),
        "attn_k.weight": (c.kv_dim, c.d_model),
        "attn_v.weight": (c.kv_dim, c.d_model),
        "attn_output.weight": (c.d_model, c.q_dim),
        "ffn_norm.weight": (1, c.d_model),
        "ffn_gate.weight": (c.d_ff, c.d_model),
        "ffn_up.weight": (c.d_ff, c.d_model),
        "ffn_down.weight": (c.d_model, c.d_ff),
        "attn_q_norm.weight": (1, c.head_dim),
        "attn_k_norm.weight": (1, c.head_dim),
        "post_attention_norm.weight": (1, c.d_model),
        "post_ffw_norm.weight": (1, c.d_model),
        "attn_q.bias": (1, c.q_dim),
        "attn_k.bias": (1, c.kv_dim),
        "attn_v.bias": (1, c.kv_dim),
    }
    for i in range(c.n_layers):
        for name in c.arch.layer_tensors():
            shapes[f"blk.{i}.{name}"] = per_layer[name]
    return shapes
