"""The NumPy reference forward pass: its building blocks, its KV-cache consistency, and that the
real model says sensible things through it."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from reference import ReferenceModel, attention, rope

from gpu.model.load import Model, load_model
from gpu.model.synthetic import write_tiny_gguf
from gpu.model.tokenizer import Tokenizer
from runtime.scheduling.work import GREEDY, Sampling

Q = gguf.GGMLQuantizationType


def assert_close(a: np.ndarray, b: np.ndarray, rel: float = 1e-4) -> None:
    scale = max(float(np.abs(b).max()), 1e-6)
    assert float(np.abs(a - b).max()) <= rel * scale


# ---------------------------------------------------------------- building blocks


def test_rope_rotates_adjacent_pairs() -> None:
    inv_freq = 10000.0 ** (-np.arange(0, 8, 2) / 8)
    x = np.zeros((1, 1, 8), dtype=np.float32)
    x[0, 0, 2] = 1.0  # first element of pair 1
    out = rope(x, np.array([3]), inv_freq)[0, 0]
    angle = 3 * inv_freq[1]
    np.testing.assert_allclose(out, [0, 0, np.cos(angle), np.sin(angle), 0, 0, 0, 0], atol=1e-6)
    np.testing.assert_array_equal(rope(x, np.array([0]), inv_freq), x)  # position 0: identity


def test_rope_scores_depend_on_relative_position_only() -> None:
    rng = np.random.default_rng(0)
    inv_freq = 100000.0 ** (-np.arange(0, 64, 2) / 64)
    q, k = rng.normal(size=(2, 1, 1, 64)).astype(np.float32)
    score = lambda m, n: float((rope(q, np.array([m]), inv_freq) * rope(k, np.array([n]), inv_freq)).sum())  # noqa: E731
    assert score(10, 7) == pytest.approx(score(103, 100), rel=1e-4)
    assert score(10, 7) != pytest.approx(score(10, 8), rel=1e-3)


def test_attention_matches_a_plain_loop() -> None:
    rng = np.random.default_rng(1)
    T, start, n_heads, n_kv, hd = 3, 4, 6, 2, 8
    q = rng.normal(size=(T, n_heads, hd)).astype(np.float32)
    k = rng.normal(size=(start + T, n_kv, hd)).astype(np.float32)
    v = rng.normal(size=(start + T, n_kv, hd)).astype(np.float32)
    out = attention(q, k, v, start)
    for t in range(T):
        for h in range(n_heads):
            kv = h // (n_heads // n_kv)  # grouped-query: consecutive query heads share a KV head
            visible = start + t + 1
            s = k[:visible, kv] @ q[t, h] / np.sqrt(hd)
            w = np.exp(s - s.max())
            w /= w.sum()
            np.testing.assert_allclose(out[t, h], w @ v[:visible, kv], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- the tiny model


@pytest.mark.parametrize("weight_type", [Q.Q4_1, Q.Q8_0, Q.F16, Q.F32])
def test_tiny_forward_every_weight_type(tmp_path: Path, weight_type) -> None:
    model = load_model(write_tiny_gguf(tmp_path / "m.gguf", weight_type=weight_type, tied=weight_type != Q.F32))
    ref = ReferenceModel(model)
    tokens = Tokenizer.from_model(model).chat([{"role": "user", "content": "hello there"}])
    cache = ref.new_cache()
    logits = ref.forward(tokens, 0, cache)
    assert logits.shape == (len(tokens), model.config.vocab_size) and logits.dtype == np.float32
    assert np.isfinite(logits).all()
    assert 0.1 < float(logits.std()) < 10.0  # random weights keep activations sane
    assert cache.length == len(tokens)


def test_tiny_chunked_prefill_equals_token_by_token(tiny_model: Model) -> None:
    ref = ReferenceModel(tiny_model)
    tokens = list(range(3, 40))
    whole = ref.forward(tokens, 0, ref.new_cache())
    one_by_one_cache = ref.new_cache()
    one_by_one = np.concatenate([ref.forward([t], i, one_by_one_cache) for i, t in enumerate(tokens)])
    chunks_cache = ref.new_cache()
    chunks = np.concatenate([ref.forward(tokens[a:b], a, chunks_cache) for a, b in [(0, 5), (5, 6), (6, 30), (30, 37)]])
    assert_close(one_by_one, whole)
    assert_close(chunks, whole)
    for layer in range(tiny_model.config.n_layers):
        assert_close(one_by_one_cache.k[layer], chunks_cache.k[layer])


def test_forward_must_continue_the_cache(tiny_model: Model) -> None:
    ref = ReferenceModel(tiny_model)
    cache = ref.new_cache()
    ref.forward([5, 6], 0, cache)
    with pytest.raises(ValueError, match="cache holds 2"):
        ref.forward([7], 3, cache)


def test_tiny_generate_positions_and_stop(tiny_model: Model) -> None:
    ref = ReferenceModel(tiny_model)
    prompt = [1, 80, 81, 82]
    s = Sampling(temperature=1.0, top_p=0.9, seed=11)
    out = ref.generate(prompt, 12, s)
    assert len(out) == 12 and out == ref.generate(prompt, 12, s)
    # the k-th new token is sampled at position len(prompt) + k from the logits before it
    from gpu.sampling import sample

    logits = ref.forward(prompt + out[:-1], 0, ref.new_cache())
    assert [sample(logits[len(prompt) - 1 + k], s, len(prompt) + k) for k in range(12)] == out
    stopped = ref.generate(prompt, 12, s, stop_ids={out[3]})
    assert stopped == out[: out.index(out[3]) + 1]


# ---------------------------------------------------------------- SmolLM2


@pytest.fixture(scope="module")
def smollm2_ref(smollm2_model: Model) -> ReferenceModel:
    return ReferenceModel(smollm2_model)


@pytest.mark.model
def test_smollm2_answers_the_capital_of_france(smollm2_ref: ReferenceModel, smollm2_tokenizer: Tokenizer) -> None:
    tok = smollm2_tokenizer
    prompt = tok.chat([{"role": "user", "content": "What is the capital of France?"}])
    out = smollm2_ref.generate(prompt, 20, GREEDY, stop_ids=tok.eos_ids)
    text = tok.decode(out, skip_special=True)
    assert text.startswith("The capital of France is Paris"), text
    assert out[-1] in tok.eos_ids  # it ends its turn on its own


@pytest.mark.model
def test_smollm2_writes_coherent_english(smollm2_ref: ReferenceModel, smollm2_tokenizer: Tokenizer) -> None:
    tok = smollm2_tokenizer
    prompt = tok.chat([{"role": "user", "content": "Write a haiku about the sea."}])
    text = tok.decode(smollm2_ref.generate(prompt, 14, GREEDY), skip_special=True)
    words = text.lower().replace(",", " ").split()
    assert {"the", "sea"} <= set(words) or {"the", "waves"} <= set(words), text


@pytest.mark.model
def test_smollm2_prefill_equals_token_by_token(smollm2_ref: ReferenceModel, smollm2_tokenizer: Tokenizer) -> None:
    tokens = smollm2_tokenizer.chat([{"role": "user", "content": "Hi!"}])[:10]
    whole = smollm2_ref.forward(tokens, 0, smollm2_ref.new_cache())
    cache = smollm2_ref.new_cache()
    one_by_one = np.concatenate([smollm2_ref.forward([t], i, cache) for i, t in enumerate(tokens)])
    assert_close(one_by_one, whole)
    assert (one_by_one.argmax(axis=1) == whole.argmax(axis=1)).all()
