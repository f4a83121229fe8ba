"""The fetched catalogue models: Qwen2.5-Coder-0.5B's and Gemma 3 270M's greedy tokens on the
engine against the NumPy reference, and every real tokenizer's ids for a few chat prompts,
derived by hand from the published pre-tokenizer rules (each expected piece is looked up as
one vocabulary entry).

These need the model in the cache; without it they skip and say how to fetch it. CI fetches
SmolLM2 and Qwen2.5-Coder-0.5B before the suite (the README's test command).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from reference import ReferenceModel, for_engine

from gpu.engine import OpenCLEngine
from gpu.model.catalogue import CATALOGUE
from gpu.model.fetch import cached
from gpu.model.load import Model, load_model
from gpu.model.tokenizer import Tokenizer, bytes_to_unicode
from runtime.scheduling.work import Work

pytestmark = pytest.mark.fetched_model


def fetched(name: str) -> Path:
    path = cached(CATALOGUE[name])
    if path is None:
        pytest.skip(f"{name} is not in the model cache; fetch it with `swarm models --fetch {name}`")
    return path


@pytest.fixture(scope="module")
def qwen() -> Model:
    return load_model(fetched("qwen2.5-coder-0.5b"))


@pytest.fixture(scope="module")
def qwen_tokenizer(qwen: Model) -> Tokenizer:
    return Tokenizer.from_model(qwen)


# ---------------------------------------------------------------- greedy tokens


PROMPTS = [
    "Write a Python function that reverses a string.",
    "What does `git rebase` do? Answer in one sentence.",
    "Fix the bug: def add(a, b): return a - b",
]


def greedy_tokens(engine: OpenCLEngine, prompts: list[list[int]], n_new: int = 32) -> list[list[int]]:
    """n_new greedy tokens for each prompt, decoded together on the engine (8 blocks each)."""
    tables = [list(range(8 * i, 8 * i + 8)) for i in range(len(prompts))]
    outs = [[t] for t in engine.step([Work(turn=i, tokens=p, start=0, block_table=tables[i], sample=True)
                                      for i, p in enumerate(prompts)])]  # fmt: skip
    while len(outs[0]) < n_new:
        batch = [Work(turn=i, tokens=[o[-1]], start=len(p) + len(o) - 1, block_table=tables[i], sample=True)
                 for i, (p, o) in enumerate(zip(prompts, outs, strict=False))]  # fmt: skip
        for o, t in zip(outs, engine.step(batch), strict=False):
            o.append(t)
    return outs


def assert_reference_agrees(
    reference: ReferenceModel, tokenizer: Tokenizer, prompts: list[list[int]], outs: list[list[int]], tie: float = 0.0
) -> None:
    """The reference reads each prompt plus the engine's tokens in one forward pass: its argmax
    at every position equal to the engine's next token is the same as its own greedy run
    producing them (each step would see exactly the prefix the engine saw), at one pass's cost.
    With `tie`, the engine's token may instead be one the reference puts within `tie` of its
    argmax's logit."""
    for prompt, out in zip(prompts, outs, strict=False):
        logits = reference.forward(prompt + out[:-1], 0, reference.new_cache())[len(prompt) - 1 :]
        want = np.argmax(logits, axis=-1)
        behind = logits[np.arange(len(out)), want] - logits[np.arange(len(out)), out]
        assert out == want.tolist() or behind.max() <= tie, (tokenizer.decode(out), behind.max())


def test_qwen_greedy_tokens_equal_the_reference(qwen: Model, qwen_tokenizer: Tokenizer, monkeypatch) -> None:
    """32 greedy tokens for each of 3 prompts, as a user's engine runs them (its Q4_K and Q6_K
    matmuls on 8-bit inputs), against a reference that rounds their inputs too. An input near a
    rounding boundary may land on either side of it in the engine's float sums and the
    reference's, and their logits part by up to about 0.8 on these prompts, so the engine's
    token may be a near tie of the reference's (within 1.0 of its logit) rather than its argmax.
    (16-bit inputs, SLOTSWARM_INT8=0, are held to the exact argmax on synthetic models:
    tests/test_engine_archs.py and tests/test_layer_launch.py.)"""
    monkeypatch.delenv("SLOTSWARM_INT8", raising=False)
    prompts = [qwen_tokenizer.chat([{"role": "user", "content": p}]) for p in PROMPTS]
    engine = OpenCLEngine(qwen, num_blocks=3 * 8)
    assert engine.family.int8
    outs = greedy_tokens(engine, prompts)
    assert_reference_agrees(for_engine(qwen, engine), qwen_tokenizer, prompts, outs, tie=1.0)
    assert "def " in qwen_tokenizer.decode(outs[0])  # a coder writes code


def test_gemma3_greedy_tokens_equal_the_reference() -> None:
    """Gemma 3's post-norms, GELU, QK-norms and embedding scale on both kernel families, 32
    greedy tokens for each of 3 prompts (no chat template: the plain prompt format); one
    reference pass checks the GPU family's, and the CPU family's must be the same. The
    sliding window (512 positions) is past these prompts; the synthetic models test it."""
    gemma = load_model(fetched("gemma3-270m"))
    tokenizer = Tokenizer.from_model(gemma)
    prompts = [tokenizer.chat([{"role": "user", "content": p}]) for p in ["def fibonacci(n):", *PROMPTS[1:]]]
    outs = {k: greedy_tokens(OpenCLEngine(gemma, num_blocks=3 * 8, kernels=k), prompts) for k in ("cpu", "gpu")}
    assert_reference_agrees(ReferenceModel(gemma), tokenizer, prompts, outs["gpu"])
    assert outs["cpu"] == outs["gpu"]
    assert "return" in tokenizer.decode(outs["gpu"][0])


# ---------------------------------------------------------------- tokenizers


def ids_of(model: Model, pieces: list[str | int], *, spm: bool = False) -> list[int]:
    """Ids of hand-split pieces, each one vocabulary entry (ints are ids already)."""
    vocab = {s: i for i, s in enumerate(model.metadata["tokenizer.ggml.tokens"])}
    table = bytes_to_unicode()
    out = []
    for piece in pieces:
        if isinstance(piece, int):
            out.append(piece)
            continue
        if spm:  # user-defined pieces (Gemma's whitespace runs) are spelled as they are
            spelled = piece if piece.strip() == "" and piece in vocab else piece.replace(" ", "\u2581")
        else:
            spelled = "".join(table[b] for b in piece.encode())
        assert spelled in vocab, f"{piece!r} is not one vocabulary entry"
        out.append(vocab[spelled])
    return out


def test_qwen_chat_prompt_ids(qwen: Model, qwen_tokenizer: Tokenizer) -> None:
    """qwen2 pre-tokenizer: letters with at most one leading non-letter, every digit alone,
    punctuation runs with their newlines, whitespace runs that leave one space to the next word."""
    start, end = 151644, 151645  # <|im_start|>, <|im_end|>
    cases = {
        # "  #": a run of spaces leaves its last to the punctuation; "\tdef": one leading non-letter
        "x = 10  # π\n\n\tdef f(a):\n    return a": [
            "x",
            " =",
            " ",
            "1",
            "0",
            " ",
            " #",
            " π",
            "\n\n",
            "\tdef",
            " f",
            "(a",
            "):\n",
            "   ",
            " return",
            " a",
        ],  # fmt: skip
        "Hi über café — 2024!": ["Hi", " über", " café", " —", " ", "2", "0", "2", "4", "!"],
        "tabs\t\tand   spaces😀": ["tabs", "\t", "\tand", "  ", " spaces", "😀"],
    }
    for text, pieces in cases.items():
        got = qwen_tokenizer.chat([{"role": "system", "content": "You are a helpful assistant."},
                                   {"role": "user", "content": text}])  # fmt: skip
        want = ids_of(qwen, [start, "system", "\n", "You", " are", " a", " helpful", " assistant", ".", end, "\n",
                             start, "user", "\n", *pieces, end, "\n", start, "assistant", "\n"])  # fmt: skip
        assert got == want, text


def test_smollm2_chat_prompt_ids(smollm2_model: Model, smollm2_tokenizer: Tokenizer) -> None:
    """smollm pre-tokenizer: every digit alone, then GPT-2's rules (a whitespace run leaves
    its last space to the next word, so "\n  return" is "\n " + " return"; SmolLM2's vocabulary
    has no "assistant", its BPE ends at "ass" + "istant")."""
    got = smollm2_tokenizer.chat([{"role": "user", "content": "add(12, 3)\n  return x"}])
    want = ids_of(smollm2_model, [1, "user", "\n", "add", "(", "1", "2", ",", " ", "3", ")", "\n ", " return", " x",
                                  2, "\n", 1, "ass", "istant", "\n"])  # fmt: skip
    assert got[-len(want) :] == want


def test_gemma3_prompt_ids() -> None:
    """SentencePiece: '▁' marks a space, no space prefix (add_space_prefix is false), runs of
    newlines and spaces are user-defined pieces, a character without a piece is its bytes."""
    model = load_model(fetched("gemma3-270m"))
    tok = Tokenizer.from_model(model)
    assert tok.encode("Hello world") == ids_of(model, ["Hello", " world"], spm=True)
    assert tok.encode("def f():\n    return 1") == ids_of(model, ["def", " f", "():", "\n", "    ", "return", " ", "1"], spm=True)
    assert tok.chat([{"role": "user", "content": "Hi"}])[0] == 2  # <bos>: no template, plain format
    assert tok.decode(tok.encode("naïve 日本語 🙂")) == "naïve 日本語 🙂"
