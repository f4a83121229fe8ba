"""The CPU matmuls' prefetch distance follows the model's widest rows."""

from __future__ import annotations

from gpu.families import prefetch_ahead


def test_the_prefetch_grows_with_the_widest_rows():
    assert {prefetch_ahead(n) for n in (1536, 2048)} == {2048}  # SmolLM2, Gemma 3 270M
    assert {prefetch_ahead(n) for n in (2080, 4864, 8192)} == {4096}  # Qwen2.5-Coder-0.5B: 4,864
    assert prefetch_ahead(8960) == 8192  # Qwen2.5-Coder-1.5B's down projection
