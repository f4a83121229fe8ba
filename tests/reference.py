"""A readable NumPy float32 forward pass, top to bottom (llama2.c style), of every architecture
gpu/model/arch.py describes; the description's flags switch the optional parts on.

It is the yardstick the OpenCL engine is tested against, not a fast path: every weight is
dequantized to float32 once, and the KV cache is one contiguous array per layer. Unless
SLOTSWARM_INT8=0, the CPU family rounds the inputs of its compact Q4_K and Q6_K matmuls to 8
bits, and with =all those of its Q4_0 and Q4_1 ones (kernels/cpu/nibbles.cl); `int8_types`
names the types whose matmuls round them so here too (`for_engine` picks them for an engine).

    ref = ReferenceModel(load_model(path))
    ids = ref.generate(prompt_ids, max_tokens=20, sampling=GREEDY)

Conventions the engine must share:
- RoPE rotates pair i of each head by pos * inv_freq[i], inv_freq = config.inv_freq(layer):
  ADJACENT pairs (x[2i], x[2i+1]) for llama (ggml mode 0; llama.cpp's converter permuted Q
  and K for it), halves (x[i], x[i + head_dim/2]) for the "neox" architectures.
- Query head h reads KV head h // (n_heads // n_kv_heads).
- Sampling position: the k-th new token after an n-token prompt is sampled with
  position n + k, the position it will occupy (see gpu/sampling.py).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import gguf
import numpy as np

from gpu.model import quants
from gpu.model.load import Model, ModelConfig, WeightTensor
from gpu.sampling import sample
from runtime.scheduling.work import GREEDY, Sampling

Q = gguf.GGMLQuantizationType


@dataclass
class ReferenceCache:
    """K and V of every position so far, per layer: (length, n_kv_heads, head_dim) float32."""

    config: ModelConfig
    k: list[np.ndarray] = field(default_factory=list)
    v: list[np.ndarray] = field(default_factory=list)

    @classmethod
    def new(cls, config: ModelConfig) -> ReferenceCache:
        empty = np.zeros((0, config.n_kv_heads, config.head_dim), dtype=np.float32)
        return cls(config, [empty] * config.n_layers, [empty] * config.n_layers)

    @property
    def length(self) -> int:
        return self.k[0].shape[0]

    def append(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        self.k[layer] = np.concatenate([self.k[layer], k])
        self.v[layer] = np.concatenate([self.v[layer], v])


class Int8Matrix:
    """A Q4_K, Q6_K, Q4_0 or Q4_1 matrix as the CPU family multiplies it. Q4_K and Q6_K: each
    input super-block of 256 rounded to 8 bits in steps of u m_b, u 1/8 of its largest |x| / 127
    (llama.cpp's Q8_K step) and m_b (1..8) the least block b's largest |x| allows, against the
    scaled quants. Q4_0 and Q4_1: each input block of 32 in steps of its largest |x| / 127
    (llama.cpp's Q8_1), against d times the nibbles. Q4_K's, Q4_0's (-8d) and Q4_1's offsets
    against the float inputs' sums of each block of 32."""

    BLOCK_STEPS = 8

    def __init__(self, t: WeightTensor) -> None:
        blocks = np.asarray(t.raw, np.uint8).reshape(-1, t.block_bytes)
        self.per_block = t.qtype in (Q.Q4_0, Q.Q4_1)
        if self.per_block:
            d = quants._f16(blocks, 0)
            q = quants._nibbles(blocks[:, 2:18] if t.qtype == Q.Q4_0 else blocks[:, 4:20])
            self.scaled = (q * d).reshape(t.rows, t.cols).astype(np.float32)
            self.offset = (-8 * d if t.qtype == Q.Q4_0 else quants._f16(blocks, 2)).reshape(t.rows, t.cols // 32)
            return
        q, scale, offset = quants.SUBBLOCKS[t.qtype](blocks)
        sub = q.shape[1] // scale.shape[1]
        self.scaled = (q.reshape(len(q), -1, sub) * scale[:, :, None]).reshape(t.rows, t.cols).astype(np.float32)
        self.offset = np.repeat(offset, sub // 32, axis=1).reshape(t.rows, t.cols // 32) if offset.any() else None

    def times(self, x: np.ndarray) -> np.ndarray:
        y = (self.rounded_blocks(x) if self.per_block else self.rounded(x)) @ self.scaled.T
        if self.offset is not None:
            y += x.reshape(len(x), -1, 32).sum(axis=2) @ self.offset.T
        return y

    @staticmethod
    def rounded_blocks(x: np.ndarray) -> np.ndarray:
        """x as Q4_0's and Q4_1's 8-bit inputs stand for it, float32 operation for operation as
        the kernel's (cpu/nibbles.cl's quantize_group_columns)."""
        f32 = np.float32
        blocks = x.astype(f32).reshape(len(x), -1, 32)
        amax = np.abs(blocks).max(axis=2, keepdims=True)
        to_int = np.where(amax > 0, f32(127) / np.where(amax > 0, amax, f32(1)), f32(0))
        return (np.round(blocks * to_int) * (amax / f32(127))).reshape(x.shape)

    @classmethod
    def rounded(cls, x: np.ndarray) -> np.ndarray:
        """x as Q4_K's and Q6_K's 8-bit inputs stand for it: steps and quants float32 operation
        for operation as the kernel's (cpu/nibbles.cl's quantize_super_bytes)."""
        n, f32 = np.float32(cls.BLOCK_STEPS), np.float32
        blocks = x.astype(f32).reshape(len(x), -1, 8, 32)
        amax = np.abs(blocks).max(axis=(2, 3), keepdims=True)
        block_max = np.abs(blocks).max(axis=3, keepdims=True)
        live = amax > 0
        safe = np.where(live, amax, f32(1))
        steps = np.where(live, np.clip(np.ceil(n * block_max / safe), f32(1), n), f32(1))
        to_int = np.where(live, (f32(127) * n) / (safe * steps), f32(0))
        return (np.round(blocks * to_int) * steps * (amax / (f32(127) * n))).reshape(x.shape)


def matmul(x: np.ndarray, w: np.ndarray | Int8Matrix) -> np.ndarray:
    """x @ w.T"""
    return w.times(x) if isinstance(w, Int8Matrix) else x @ w.T


class ReferenceModel:
    def __init__(self, model: Model, int8_types: Collection = ()) -> None:
        self.config = c = model.config
        self.arch = c.arch
        w = lambda name: model.tensor(name).dequantize()  # noqa: E731

        def matrix(t: WeightTensor) -> np.ndarray | Int8Matrix:
            return Int8Matrix(t) if t.qtype in int8_types else t.dequantize()

        self.embedding = w("token_embd.weight")  # (vocab, d)
        # layer i's tensors by their name after "blk.i.", e.g. "attn_q.weight", "attn_q.bias"
        self.layers = [{name: matrix(model.tensor(f"blk.{i}.{name}")) for name in c.arch.layer_tensors()} for i in range(c.n_layers)]
        self.output_norm = w("output_norm.weight")
        head = model.tensor("token_embd.weight") if model.tied else model.output_weight()
        self.output = self.embedding if model.tied and head.qtype not in int8_types else matrix(head)
        self.inv_freq = [c.inv_freq(i) for i in range(c.n_layers)]
        self.embed_scale = np.float32(np.sqrt(c.d_model)) if c.arch.embed_scale else np.float32(1.0)
        self.activation = gelu if c.arch.activation == "gelu" else silu

    def new_cache(self) -> ReferenceCache:
        return ReferenceCache.new(self.config)

    def forward(self, tokens: list[int], start: int, cache: ReferenceCache) -> np.ndarray:
        """Logits (len(tokens), vocab) for tokens at positions start.., appending their K/V to
        `cache`, which must already hold exactly the positions before `start`."""
        c, arch = self.config, self.arch
        if start != cache.length:
            raise ValueError(f"forward at position {start}, but the cache holds {cache.length} positions")
        T = len(tokens)
        positions = np.arange(start, start + T)
        x = self.embedding[np.asarray(tokens)] * self.embed_scale  # (T, d)

        for i, L in enumerate(self.layers):
            # ---- attention
            h = rmsnorm(x, L["attn_norm.weight"], c.norm_eps)
            q, k, v = (matmul(h, L[f"attn_{n}.weight"]) for n in "qkv")
            if arch.qkv_bias:
                q, k, v = q + L["attn_q.bias"], k + L["attn_k.bias"], v + L["attn_v.bias"]
            q = q.reshape(T, c.n_heads, c.head_dim)
            k = k.reshape(T, c.n_kv_heads, c.head_dim)
            v = v.reshape(T, c.n_kv_heads, c.head_dim)
            if arch.qk_norm:
                q = rmsnorm(q, L["attn_q_norm.weight"], c.norm_eps)
                k = rmsnorm(k, L["attn_k_norm.weight"], c.norm_eps)
            q = rope(q, positions, self.inv_freq[i], arch.rope)
            k = rope(k, positions, self.inv_freq[i], arch.rope)
            cache.append(i, k, v)
            att = attention(q, cache.k[i], cache.v[i], start, c.window(i))  # (T, n_heads, head_dim)
            out = matmul(att.reshape(T, c.q_dim), L["attn_output.weight"])
            if arch.post_norms:
                out = rmsnorm(out, L["post_attention_norm.weight"], c.norm_eps)
            x = x + out

            # ---- feed-forward (gated: act(gate) * up)
            h = rmsnorm(x, L["ffn_norm.weight"], c.norm_eps)
            out = matmul(self.activation(matmul(h, L["ffn_gate.weight"])) * matmul(h, L["ffn_up.weight"]), L["ffn_down.weight"])
            if arch.post_norms:
                out = rmsnorm(out, L["post_ffw_norm.weight"], c.norm_eps)
            x = x + out

        x = rmsnorm(x, self.output_norm, c.norm_eps)
        return matmul(x, self.output)  # (T, vocab)

    def generate(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        sampling: Sampling = GREEDY,
        *,
        stop_ids: Collection[int] = (),
    ) -> list[int]:
        """Up to `max_tokens` new tokens after the prompt; stops after emitting one of `stop_ids`
        (which is included). The k-th new token is sampled with position len(prompt_ids) + k."""
        cache = self.new_cache()
        logits = self.forward(list(prompt_ids), 0, cache)[-1]
        out: list[int] = []
        for k in range(max_tokens):
            position = len(prompt_ids) + k
            token = sample(logits, sampling, position)
            out.append(token)
            if token in stop_ids or k == max_tokens - 1:
                break
            logits = self.forward([token], position, cache)[-1]
        return out


def for_engine(model: Model, engine) -> ReferenceModel:
    """The reference for an OpenCLEngine's logits: unless SLOTSWARM_INT8=0, the CPU family
    rounds the inputs of its compact Q4_K and Q6_K matmuls to 8 bits, and with =all its Q4_0
    and Q4_1 ones too."""
    family = engine.family
    nibbles = {Q.Q4_0, Q.Q4_1} if family.int8_nibbles else set()
    return ReferenceModel(model, family.compact & {Q.Q4_K, Q.Q6_K} | nibbles if family.int8 else ())


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray, style: str = "adjacent") -> np.ndarray:
    """Rotate pair i of every head by angle position * inv_freq[i]. x: (T, heads, head_dim).
    The pairs are adjacent, (x[2i], x[2i+1]), or for "neox" the halves, (x[i], x[i + hd/2])."""
    angle = positions[:, None] * inv_freq[None, :]  # (T, head_dim/2), float64 for exact angles
    cos = np.cos(angle).astype(np.float32)[:, None, :]
    sin = np.sin(angle).astype(np.float32)[:, None, :]
    half = x.shape[-1] // 2
    first, second = (np.s_[..., 0::2], np.s_[..., 1::2]) if style == "adjacent" else (np.s_[..., :half], np.s_[..., half:])
    x0, x1 = x[first], x[second]
    out = np.empty_like(x)
    out[first] = x0 * cos - x1 * sin
    out[second] = x0 * sin + x1 * cos
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int, window: int = 0) -> np.ndarray:
    """Causal grouped-query attention. q: (T, n_heads, hd) for positions start..start+T-1;
    k, v: (start+T, n_kv_heads, hd), every position so far. With a window, a query at p sees
    only the keys p - window < s <= p."""
    T, n_heads, hd = q.shape
    group = n_heads // k.shape[1]
    k = np.repeat(k, group, axis=1)  # query head h reads KV head h // group
    v = np.repeat(v, group, axis=1)
    scores = np.einsum("thd,shd->hts", q, k) / np.float32(np.sqrt(hd))  # (heads, T, S)
    S = k.shape[0]
    query_pos = (start + np.arange(T))[:, None]
    hidden = np.arange(S)[None, :] > query_pos  # key after query
    if window:
        hidden |= np.arange(S)[None, :] <= query_pos - window
    scores = np.where(hidden[None], -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    return np.einsum("hts,shd->thd", weights, v).astype(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU, tanh form (ggml_gelu; Gemma's gelu_pytorch_tanh)."""
    return 0.5 * x * (1.0 + np.tanh(np.float32(np.sqrt(2.0 / np.pi)) * (x + np.float32(0.044715) * x**3)))


def main() -> None:
    """`python -m tests.reference "prompt"`: greedy-generate with the reference, print the ids (to
    compare with the engine) and the text."""
    import argparse
    import time

    from gpu.model.fetch import resolve_model
    from gpu.model.load import load_model
    from gpu.model.tokenizer import Tokenizer

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("prompt")
    parser.add_argument("--model", default=None, help="GGUF path (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--max-tokens", type=int, default=20)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model = load_model(resolve_model(args.model))
    tokenizer = Tokenizer.from_model(model)
    ref = ReferenceModel(model)
    prompt = tokenizer.chat([{"role": "user", "content": args.prompt}])
    sampling = Sampling(temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    began = time.perf_counter()
    out = ref.generate(prompt, args.max_tokens, sampling, stop_ids=tokenizer.eos_ids)
    took = time.perf_counter() - began
    print(f"prompt ({len(prompt)} tokens): {prompt}")
    print(f"output ({len(out)} tokens, {took:.2f} s): {out}")
    print(tokenizer.decode(out, skip_special=True))


if __name__ == "__main__":
    main()
