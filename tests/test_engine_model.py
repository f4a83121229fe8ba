"""The OpenCL engine on the real default model (SmolLM2-135M-Instruct, Q4_1), in
both kernel families. Logits tolerance 2e-3 relative L2: K/V are f16 (see
tests/test_engine.py); greedy tokens must equal the float32 reference's."""

from __future__ import annotations

import numpy as np
import pytest
from reference import ReferenceModel

from gpu.engine import OpenCLEngine
from gpu.model.load import Model
from gpu.model.tokenizer import Tokenizer
from gpu.sampling import sample
from runtime.scheduling.work import GREEDY, Sampling, Work

pytestmark = pytest.mark.model


@pytest.fixture(scope="module", params=["cpu", "gpu"])
def engine(smollm2_model: Model, request: pytest.FixtureRequest) -> OpenCLEngine:
    return OpenCLEngine(smollm2_model, num_blocks=64, kernels=request.param)


@pytest.fixture(scope="module")
def reference(smollm2_model: Model) -> ReferenceModel:
    return ReferenceModel(smollm2_model)


def generate(engine: OpenCLEngine, prompt: list[int], n: int, chunk: int = 16) -> list[int]:
    """Greedy tokens after `prompt`, prefilled in chunks of `chunk`."""
    blocks = list(range(20, 40))
    token = None
    for start in range(0, len(prompt), chunk):
        piece = prompt[start : start + chunk]
        last = start + len(piece) == len(prompt)
        token = engine.step([Work(turn=0, tokens=piece, start=start, block_table=blocks, sample=last)])[0]
    out = [token]
    while len(out) < n and out[-1] not in engine.eos_token_ids:
        out.append(engine.step([Work(turn=0, tokens=[out[-1]], start=len(prompt) + len(out) - 1, block_table=blocks, sample=True)])[0])
    return out


def test_greedy_answer_agrees_with_the_reference(engine: OpenCLEngine, reference: ReferenceModel, smollm2_tokenizer: Tokenizer) -> None:
    prompt = smollm2_tokenizer.chat([{"role": "user", "content": "What is the capital of France?"}])
    got = generate(engine, prompt, 16)
    want = reference.generate(prompt, 16, stop_ids=engine.eos_token_ids)
    assert got == want
    assert "Paris" in smollm2_tokenizer.decode(got)


def test_prefill_logits_match_the_reference(engine: OpenCLEngine, reference: ReferenceModel, smollm2_tokenizer: Tokenizer) -> None:
    prompt = smollm2_tokenizer.chat([{"role": "user", "content": "Name three colours."}])
    want = reference.forward(prompt, 0, reference.new_cache())[-1]
    got = engine.step_logits([Work(turn=1, tokens=prompt, start=0, block_table=list(range(8)), sample=True)])[0]
    assert float(np.linalg.norm(got - want) / np.linalg.norm(want)) < 2e-3


def test_sampling_at_a_temperature_on_the_device_draws_what_the_host_draws(engine: OpenCLEngine, smollm2_tokenizer: Tokenizer) -> None:
    # gpu.devicesampling over SmolLM2's 49,152 logits: a draw, two top-p rows and a
    # greedy one, each against the host's draw from the whole row. The prompt is
    # prefilled once; each seed then decodes its next token (rewriting the same K/V).
    prompt = smollm2_tokenizer.chat([{"role": "user", "content": "Write a haiku about the sea."}])
    samplings = [Sampling(0.7), Sampling(0.5, 0.9), Sampling(1.3, 0.95), GREEDY]
    tables = [[8 * i + b for b in range(8)] for i in range(len(samplings))]
    engine.step([Work(turn=i, tokens=prompt[:-1], start=0, block_table=tables[i], sample=False) for i in range(len(samplings))])
    before = engine.whole_rows_read
    for seed in range(3):
        works = [Work(turn=i, tokens=prompt[-1:], start=len(prompt) - 1, block_table=tables[i], sample=True,
                      sampling=Sampling(s.temperature, s.top_p, seed) if not s.greedy else s) for i, s in enumerate(samplings)]  # fmt: skip
        rows = engine.step_logits(works)
        want = [sample(row, w.sampling, len(prompt)) for row, w in zip(rows, works, strict=False)]
        assert engine.step(works) == want
    assert engine.whole_rows_read - before < 2 * 3  # some top-p rows were finished from their candidates
