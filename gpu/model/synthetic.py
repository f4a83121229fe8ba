"""A tiny, random, but complete GGUF of any described architecture, for the tests and
for `swarm bench engine --quants` (which times every tensor type on it): loads with
`load_model`, tokenizes with `Tokenizer.from_model`, runs through the reference and the OpenCL
engine in milliseconds.

    path = write_tiny_gguf(tmp_path / "tiny.gguf")                       # Q4_1 + Q8_0 tied embedding
    path = write_tiny_gguf(tmp_path / "f32.gguf", weight_type=F32, embed_type=F32, tied=False)
    path = write_tiny_gguf(tmp_path / "g.gguf", arch="gemma3", weight_type=Q.Q4_K, d_model=256)

Every tensor type is written: the 32-weight types through gguf's own quantizer, the K-quants
(which gguf cannot quantize) as random blocks whose scales give the wanted spread.

The vocabulary mirrors SmolLM2's layout: ChatML control tokens first (0 <|endoftext|>,
1 <|im_start|>, 2 <|im_end|>), then the 256 byte tokens in GPT-2's byte-to-unicode spelling,
then a few merges, so any text encodes and decodes exactly.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from gpu.model.arch import ARCHITECTURES
from gpu.model.quants import SUPPORTED_TYPES, dequantize
from gpu.model.tokenizer import bytes_to_unicode

Q = gguf.GGMLQuantizationType

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# SmolLM2's own ChatML template, minus the default system prompt.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Merges (in priority order) over GPT-2 byte-level spellings; "Ġ" is a space.
TINY_MERGES = (
    ("Ġ", "t"),
    ("h", "e"),
    ("Ġt", "he"),
    ("i", "n"),
    ("e", "r"),
    ("a", "n"),
    ("Ġ", "a"),
    ("o", "n"),
    ("r", "e"),
    ("Ġ", "s"),
    ("e", "n"),
    ("a", "t"),
    ("o", "r"),
    ("Ġ", "w"),
    ("l", "l"),
    ("Ġ", "o"),
    ("i", "s"),
    ("e", "s"),
    ("Ġ", "c"),
    ("in", "g"),
    ("e", "d"),
    ("Ġ", "f"),
    ("o", "u"),
    ("Ġ", "b"),
    ("Ġ", "p"),
    ("i", "t"),
    ("Ġ", "m"),
    ("a", "r"),
    ("Ġ", "h"),
)  # 3 specials + 256 bytes + 29 merges = 288 tokens


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) for the tiny model."""
    tokens = list(SPECIAL_TOKENS) + [bytes_to_unicode()[b] for b in range(256)]
    tokens += [a + b for a, b in TINY_MERGES]
    types = [int(gguf.TokenType.CONTROL)] * len(SPECIAL_TOKENS)
    types += [int(gguf.TokenType.NORMAL)] * (len(tokens) - len(SPECIAL_TOKENS))
    merges = [f"{a} {b}" for a, b in TINY_MERGES]
    return tokens, types, merges


K_QUANT_SCALES = {  # byte offsets of (d, dmin) in each 256-weight block; None = no dmin
    Q.Q2_K: (80, 82),
    Q.Q3_K: (108, None),
    Q.Q4_K: (0, 2),
    Q.Q5_K: (0, 2),
    Q.Q6_K: (208, None),
}


def random_k_quant(values_shape: tuple[int, int], qtype, std: float, rng: np.random.Generator) -> np.ndarray:
    """Random `qtype` blocks (rows, bytes) whose weights have mean ~0 and spread ~std: random
    quants and sub-block scales, then one (d, dmin) for the tensor that centres and scales them."""
    rows, cols = values_shape
    block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
    raw = rng.integers(0, 256, size=(rows * cols // 256, block_bytes), dtype=np.uint8)
    d_at, m_at = K_QUANT_SCALES[qtype]

    def with_scales(d: float, dmin: float) -> np.ndarray:
        out = raw.copy()
        out[:, d_at : d_at + 2] = np.float16(d).reshape(1).view(np.uint8)
        if m_at is not None:
            out[:, m_at : m_at + 2] = np.float16(dmin).reshape(1).view(np.uint8)
        return out

    w_d = dequantize(with_scales(1.0, 0.0), qtype)
    w_m = dequantize(with_scales(0.0, 1.0), qtype) if m_at is not None else None
    dmin = -w_d.mean() / w_m.mean() if w_m is not None else 0.0
    spread = (w_d + (dmin * w_m if w_m is not None else 0.0)).std()
    return with_scales(std / spread, dmin * std / spread).reshape(rows, -1)


def write_tiny_gguf(
    path: str | Path,
    *,
    n_layers: int = 2,
    d_model: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    d_ff: int = 128,
    weight_type: gguf.GGMLQuantizationType = Q.Q4_1,
    embed_type: gguf.GGMLQuantizationType = Q.Q8_0,
    tied: bool = True,
    arch: str = "llama",
    seed: int = 0,
    drop_tensor: str | None = None,
    drop_key: str | None = None,
    bad_shape: str | None = None,
    context_length: int = 512,
    rope_base: float = 10000.0,
    head_dim: int | None = None,
    sliding_window: int = 8,
    llama3_rope: bool = False,
    v_type: gguf.GGMLQuantizationType | None = None,
    k_type: gguf.GGMLQuantizationType | None = None,
    without: str = "",
) -> Path:
    """Write a randomly initialised GGUF of architecture `arch` and return its path.

    Matrices are N(0, 1/cols) so every projection keeps activations near unit scale; the
    embedding is N(0, 0.15^2), small next to the layers' output, so logits (std ~1) depend on
    context and sampling at temperature 1 spreads over many tokens.
    `weight_type` applies to the layer matrices, `embed_type` to token_embd (and output.weight
    when untied); norms and biases are F32 as llama.cpp writes them. Quantized widths must be
    multiples of the type's block (32, or 256 for the K-quants). An architecture the project
    does not describe gets llama's tensors. `llama3_rope` adds Llama 3's rope_freqs.weight;
    `sliding_window` applies to architectures with local layers (Gemma 3: 5 of every 6);
    `v_type` gives attn_v its own type (default: weight_type), `k_type` attn_k. `without` names
    characters (ASCII) no token of the vocabulary holds (a constraint that needs one is a dead end).

    To test the loader's errors: `drop_tensor` leaves out the named tensor, `drop_key` the named
    metadata key, and `bad_shape` writes the named tensor with one row too many.
    """
    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens, types, merges = tiny_vocab()
    if without:
        lacking = {bytes_to_unicode()[ord(c)] for c in without}
        keep = [i for i, t in enumerate(tokens) if i < len(SPECIAL_TOKENS) or not lacking & set(t)]
        tokens, types = [tokens[i] for i in keep], [types[i] for i in keep]
        merges = [m for m in merges if not lacking & set(m)]
    vocab = len(tokens)
    head_dim = head_dim or d_model // n_heads
    description = ARCHITECTURES.get(arch, ARCHITECTURES["llama"])

    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"tiny-random-{arch}")
    w.add_block_count(n_layers)
    w.add_context_length(context_length)
    w.add_embedding_length(d_model)
    w.add_feed_forward_length(d_ff)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv_heads)
    if head_dim != d_model // n_heads:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(1e-5)
    if description.swa_pattern:
        w.add_sliding_window(sliding_window)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)

    def matrix(rows: int, cols: int, std: float, qtype=Q.F32):
        if qtype in K_QUANT_SCALES:
            return random_k_quant((rows, cols), qtype, std, rng)
        return rng.normal(0.0, std, size=(rows, cols)).astype(np.float32)

    def add(name: str, values: np.ndarray, qtype: gguf.GGMLQuantizationType) -> None:
        if name == drop_tensor:
            return
        if name == bad_shape:
            values = np.concatenate([values, values[-1:]]) if values.ndim == 2 else np.append(values, 1.0)
        if qtype in (Q.BF16,):
            values = values.astype(np.float32)
        if qtype == Q.F32:
            w.add_tensor(name, values.astype(np.float32))
        elif qtype == Q.F16:
            w.add_tensor(name, values.astype(np.float16))
        elif qtype in K_QUANT_SCALES:
            w.add_tensor(name, values, raw_dtype=qtype)  # already blocks of bytes
        elif qtype not in SUPPORTED_TYPES:  # for the loader's error: the bytes do not matter
            block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
            w.add_tensor(name, np.zeros((values.shape[0], values.shape[1] // block * block_bytes), np.uint8), raw_dtype=qtype)
        else:
            w.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)

    def norm(n: int = d_model) -> np.ndarray:
        return (1.0 + rng.normal(0.0, 0.1, size=n)).astype(np.float32)

    def weights(rows: int, cols: int) -> None:
        return matrix(rows, cols, cols**-0.5, weight_type)

    if llama3_rope:
        add("rope_freqs.weight", llama3_rope_factors(head_dim, rope_base), Q.F32)
    add("token_embd.weight", matrix(vocab, d_model, 0.15, embed_type), embed_type)
    q_dim, kv_dim = n_heads * head_dim, n_kv_heads * head_dim
    for i in range(n_layers):
        blk = f"blk.{i}."
        add(blk + "attn_norm.weight", norm(), Q.F32)
        add(blk + "attn_q.weight", weights(q_dim, d_model), weight_type)
        k = k_type or weight_type
        add(blk + "attn_k.weight", matrix(kv_dim, d_model, d_model**-0.5, k), k)
        v = v_type or weight_type
        add(blk + "attn_v.weight", matrix(kv_dim, d_model, d_model**-0.5, v), v)
        add(blk + "attn_output.weight", weights(d_model, q_dim), weight_type)
        add(blk + "ffn_norm.weight", norm(), Q.F32)
        add(blk + "ffn_gate.weight", weights(d_ff, d_model), weight_type)
        add(blk + "ffn_up.weight", weights(d_ff, d_model), weight_type)
        add(blk + "ffn_down.weight", weights(d_model, d_ff), weight_type)
        if description.qkv_bias:
            for name, n in (("attn_q", q_dim), ("attn_k", kv_dim), ("attn_v", kv_dim)):
                add(blk + name + ".bias", rng.normal(0.0, 0.5, size=n).astype(np.float32), Q.F32)
        if description.qk_norm:
            add(blk + "attn_q_norm.weight", norm(head_dim), Q.F32)
            add(blk + "attn_k_norm.weight", norm(head_dim), Q.F32)
        if description.post_norms:
            add(blk + "post_attention_norm.weight", norm(), Q.F32)
            add(blk + "post_ffw_norm.weight", norm(), Q.F32)
    add("output_norm.weight", norm(), Q.F32)
    if not tied:
        add("output.weight", matrix(vocab, d_model, 0.15, embed_type), embed_type)

    if drop_key is not None:
        del w.kv_data[0][drop_key]  # KeyError for a key the writer never wrote: a typo in a test
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def llama3_rope_factors(
    head_dim: int, base: float, factor: float = 8.0, low: float = 1.0, high: float = 4.0, original_context: int = 64
) -> np.ndarray:
    """rope_freqs.weight as llama.cpp's converter computes it from Llama 3's rope_scaling
    (a tiny original context, so a tiny model's frequencies span all three bands)."""
    freqs = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / freqs
    low_wavelen, high_wavelen = original_context / low, original_context / high
    smooth = (original_context / wavelen - low) / (high - low)
    factors = np.where(wavelen < high_wavelen, 1.0, np.where(wavelen > low_wavelen, factor, 1 / ((1 - smooth) / factor + smooth)))
    return factors.astype(np.float32)
