"""The CPU matmuls' prefetch distance follows the model's widest rows."""

from __future__ import annotations

from gpu.families import prefetch_ahead


def test_the_prefetch_reaches_8_kb_only_past_rows_of_8_kb():
    # SmolLM2 (1,536 inputs), Qwen2.5-Coder-0.5B (4,864), Gemma 3 270M (2,048): 4 KB
    assert {prefetch_ahead(n) for n in (1536, 2048, 4864, 8192)} == {4096}
    assert prefetch_ahead(8960) == 8192  # Qwen2.5-Coder-1.5B's down projection
