"""A tiny, random, but complete llama GGUF for tests: loads with `load_model`, tokenizes with
`Tokenizer.from_model`, runs through the reference and the OpenCL engine in milliseconds.

    path = write_tiny_gguf(tmp_path / "tiny.gguf")                       # Q4_1 + Q8_0 tied embedding
    path = write_tiny_gguf(tmp_path / "f32.gguf", weight_type=F32, embed_type=F32, tied=False)

The vocabulary mirrors SmolLM2's layout: ChatML control tokens first (0 <|endoftext|>,
1 <|im_start|>, 2 <|im_end|>), then the 256 byte tokens in GPT-2's byte-to-unicode spelling,
then a few merges, so any text encodes and decodes exactly.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from gpu.tokenizer import bytes_to_unicode

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
    ("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("e", "r"), ("a", "n"), ("Ġ", "a"),
    ("o", "n"), ("r", "e"), ("Ġ", "s"), ("e", "n"), ("a", "t"), ("o", "r"), ("Ġ", "w"),
    ("l", "l"), ("Ġ", "o"), ("i", "s"), ("e", "s"), ("Ġ", "c"), ("in", "g"), ("e", "d"),
    ("Ġ", "f"), ("o", "u"), ("Ġ", "b"), ("Ġ", "p"), ("i", "t"), ("Ġ", "m"), ("a", "r"),
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
) -> Path:
    """Write a randomly initialised llama GGUF and return its path.

    Matrices are N(0, 1/cols) so every projection keeps activations near unit scale; the
    embedding is N(0, 0.15^2), small next to the layers' output, so logits (std ~1) depend on
    context and sampling at temperature 1 spreads over many tokens.
    `weight_type` applies to the layer matrices, `embed_type` to token_embd (and output.weight
    when untied); norms are F32 as llama.cpp writes them. Quantized dims must be multiples of 32.

    To test the loader's errors: `drop_tensor` leaves out the named tensor, `drop_key` the named
    metadata key, and `bad_shape` writes the named tensor with one row too many.
    """
    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens, types, merges = tiny_vocab()
    vocab = len(tokens)
    head_dim = d_model // n_heads

    w = gguf.GGUFWriter(path, arch)
    w.add_name("tiny-random-llama")
    w.add_block_count(n_layers)
    w.add_context_length(context_length)
    w.add_embedding_length(d_model)
    w.add_feed_forward_length(d_ff)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(1e-5)
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

    def matrix(rows: int, cols: int, std: float) -> np.ndarray:
        return rng.normal(0.0, std, size=(rows, cols)).astype(np.float32)

    def add(name: str, values: np.ndarray, qtype: gguf.GGMLQuantizationType) -> None:
        if name == drop_tensor:
            return
        if name == bad_shape:
            values = np.concatenate([values, values[-1:]]) if values.ndim == 2 else np.append(values, 1.0)
        if qtype == Q.F32:
            w.add_tensor(name, values.astype(np.float32))
        elif qtype == Q.F16:
            w.add_tensor(name, values.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)

    def norm() -> np.ndarray:
        return (1.0 + rng.normal(0.0, 0.1, size=d_model)).astype(np.float32)

    add("token_embd.weight", matrix(vocab, d_model, 0.15), embed_type)
    q_dim, kv_dim = n_heads * head_dim, n_kv_heads * head_dim
    for i in range(n_layers):
        add(f"blk.{i}.attn_norm.weight", norm(), Q.F32)
        add(f"blk.{i}.attn_q.weight", matrix(q_dim, d_model, d_model**-0.5), weight_type)
        add(f"blk.{i}.attn_k.weight", matrix(kv_dim, d_model, d_model**-0.5), weight_type)
        add(f"blk.{i}.attn_v.weight", matrix(kv_dim, d_model, d_model**-0.5), weight_type)
        add(f"blk.{i}.attn_output.weight", matrix(d_model, q_dim, q_dim**-0.5), weight_type)
        add(f"blk.{i}.ffn_norm.weight", norm(), Q.F32)
        add(f"blk.{i}.ffn_gate.weight", matrix(d_ff, d_model, d_model**-0.5), weight_type)
        add(f"blk.{i}.ffn_up.weight", matrix(d_ff, d_model, d_model**-0.5), weight_type)
        add(f"blk.{i}.ffn_down.weight", matrix(d_model, d_ff, d_ff**-0.5), weight_type)
    add("output_norm.weight", norm(), Q.F32)
    if not tied:
        add("output.weight", matrix(vocab, d_model, 0.15), embed_type)

    if drop_key is not None:
        del w.kv_data[0][drop_key]  # KeyError for a key the writer never wrote: a typo in a test
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
