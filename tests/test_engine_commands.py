"""`swarm generate` and `swarm bench engine` end to end, on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reference import ReferenceModel

from gpu.model.load import load_model
from gpu.model.tokenizer import Tokenizer
from runtime.errors import ConfigError
from runtime.scheduling.work import Sampling
from swarm.bench.engine import PREFILL_REPEATS
from swarm.cli import main


def run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_json_greedy_matches_the_reference(tiny_gguf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, ["generate", "hello there", "--model", str(tiny_gguf), "--max-tokens", "12", "--json"])
    model = load_model(tiny_gguf)
    tokenizer = Tokenizer.from_model(model)
    assert out["prompt_ids"] == tokenizer.chat([{"role": "user", "content": "hello there"}])
    want = ReferenceModel(model).generate(out["prompt_ids"], 12, stop_ids=tokenizer.eos_ids)
    assert out["tokens"] == want
    assert out["text"] == tokenizer.decode(want, skip_special=True)


def test_generate_seeded_sampling_is_reproducible_and_matches_the_reference(tiny_gguf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "hi", "--model", str(tiny_gguf), "--max-tokens", "10", "--json",
            "--temperature", "1.0", "--top-p", "0.9", "--seed", "5"]  # fmt: skip
    first, second = run_json(capsys, argv), run_json(capsys, argv)
    timings = ("ttft_s", "turn_s", "tokens_per_s")  # the run's, not the answer's
    assert {k: v for k, v in first.items() if k not in timings} == {k: v for k, v in second.items() if k not in timings}
    model = load_model(tiny_gguf)
    sampling = Sampling(temperature=1.0, top_p=0.9, seed=5)
    eos = Tokenizer.from_model(model).eos_ids
    assert first["tokens"] == ReferenceModel(model).generate(first["prompt_ids"], 10, sampling, stop_ids=eos)


def test_generate_streams_text(tiny_gguf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "hello", "--model", str(tiny_gguf), "--max-tokens", "8"]) == 0
    streamed = capsys.readouterr().out
    want = run_json(capsys, ["generate", "hello", "--model", str(tiny_gguf), "--max-tokens", "8", "--json"])
    assert streamed == want["text"] + "\n"


def test_generate_json_gives_timings_and_why_it_stopped(tiny_gguf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, ["generate", "hi", "--model", str(tiny_gguf), "--max-tokens", "4", "--json"])
    assert out["finish_reason"] == "length" and len(out["tokens"]) == 4  # the tiny model never ends "hi" this early
    assert 0 < out["ttft_s"] <= out["turn_s"] and out["tokens_per_s"] > 0


def test_generate_says_when_the_answer_is_cut_off_at_max_tokens(tiny_gguf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "hi", "--model", str(tiny_gguf), "--max-tokens", "4"]) == 0
    out, err = capsys.readouterr()
    lines = err.splitlines()  # a cold kernel cache's one line may come first
    assert out.endswith("\n") and lines[-1] == "(the answer was cut off at 4 tokens: --max-tokens N for more)" and len(lines) <= 2


def test_generate_rejects_greedy_with_a_temperature(tiny_gguf: Path) -> None:
    from swarm.cli import build_parser

    args = build_parser().parse_args(["generate", "x", "--model", str(tiny_gguf), "--greedy", "--temperature", "1"])
    with pytest.raises(ConfigError, match="exclude each other"):
        args.func(args)


def test_bench_engine_json_reports_every_field(tiny_gguf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, ["bench", "engine", "--model", str(tiny_gguf), "--steps", "2", "--json"])
    assert [s["batch"] for s in out["steps"]] == [1, 2, 4, 8]
    assert all(s["step_ms"] > 0 for s in out["steps"])
    for key in ("prefill_tok_per_s", "decode_tok_per_s", "weight_bytes_per_step", "copy_gb_s", "achieved_gb_s"):
        assert out[key] > 0
    assert out["device"]
    assert out["ttft_prompt_tokens"] == 511  # the tiny model's context allows no 1,000
    assert out["long"]["batch"] == 8 and out["long"]["positions"] == 512 - 2 - 2 and out["long"]["step_ms"] > 0
    assert out["ttft_uncached_ms"] > 0 and out["ttft_cached_ms"] > 0
    law = out["step_cost"]
    assert min(law["fixed_s"], law["token_s"], law["kv_s"]) >= 0 and law["fixed_s"] + law["token_s"] > 0
    assert law["calibration_steps"] > 0 and law["observed_steps"] == PREFILL_REPEATS + 4 * 3  # the prefills and every timed decode
    if out["kernels"] == "cpu":  # the prompt against its multiply ceiling (the tiny model's Q4_1 on 16-bit inputs)
        assert list(out["multiply_ceiling"]) == ["16"] and out["multiply_ceiling"]["16"] > 0 and out["prefill_ceiling_share"] > 0


@pytest.mark.parametrize("kernels", ["cpu", "gpu"])
def test_generate_gives_the_reference_tokens_with_either_kernel_family(
    tiny_gguf: Path, capsys: pytest.CaptureFixture[str], kernels: str
) -> None:
    greedy = ["generate", "hello there", "--model", str(tiny_gguf), "--max-tokens", "12", "--json", "--kernels", kernels]
    sampled = greedy + ["--temperature", "1.0", "--top-p", "0.9", "--seed", "5"]
    model = load_model(tiny_gguf)
    ref, eos = ReferenceModel(model), Tokenizer.from_model(model).eos_ids
    out = run_json(capsys, greedy)
    assert out["tokens"] == ref.generate(out["prompt_ids"], 12, stop_ids=eos)
    out = run_json(capsys, sampled)
    assert out["tokens"] == ref.generate(out["prompt_ids"], 12, Sampling(temperature=1.0, top_p=0.9, seed=5), stop_ids=eos)


@pytest.mark.parametrize("kernels, per_layer", [("cpu", 5), ("gpu", 5)])
def test_bench_engine_profile_breaks_a_step_down_by_kernel(
    tiny_gguf: Path, capsys: pytest.CaptureFixture[str], kernels: str, per_layer: int
) -> None:
    out = run_json(capsys, ["bench", "engine", "--model", str(tiny_gguf), "--steps", "2", "--json", "--profile", "--kernels", kernels])
    assert out["kernels"] == kernels
    assert ("multiply_ceiling" in out) == (kernels == "cpu")  # (cpu/nibbles.cl's)
    layers = load_model(tiny_gguf).config.n_layers
    for step in out["steps"] + [out["long"]]:
        p = step["profile"]
        assert p["launches"] == 1 + per_layer * layers + 2  # embed, the layers, head, argmax
        assert {"qkv", "attention", "out", "swiglu", "down", "head", "argmax", "embed"} <= set(p["kernels"])
        assert abs(sum(k["share"] for k in p["kernels"].values()) - 1) < 1e-6
        assert p["kernels"]["head"]["gb_s"] > 0 and "gb_s" not in p["kernels"]["argmax"]
        assert p["device_ms"] > 0 and p["idle_ms"] >= 0 and p["wall_ms"] > 0
