"""scripts/llamacpp_bench.py reads llama.cpp's tools as they print: outputs captured
from llama-bench (`-o json`) and llama-batched-bench (`--output-format jsonl`) of the
llama.cpp vendored in llama-cpp-python 0.3.36, and from `swarm bench engine --json`
(trimmed to the fields the script reads). No benchmark runs here."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data" / "llamacpp"

spec = importlib.util.spec_from_file_location("llamacpp_bench", ROOT / "scripts" / "llamacpp_bench.py")
bench = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench  # (its dataclasses look their module up there)
spec.loader.exec_module(bench)


def test_llama_bench_json_gives_the_batch_1_step_prefill_and_first_token() -> None:
    figures = bench.parse_llama_bench((DATA / "llama-bench.json").read_text())
    tests = {(t["n_prompt"], t["n_gen"]): t["avg_ns"] for t in json.loads((DATA / "llama-bench.json").read_text())}
    assert set(figures) == {"batch1_ms", "prefill_tok_s", "ttft_ms"}
    assert figures["batch1_ms"] == pytest.approx(tests[0, 64] / 64 / 1e6)  # ms per generated token
    assert figures["prefill_tok_s"] == pytest.approx(256 / (tests[256, 0] / 1e9))
    assert figures["ttft_ms"] == pytest.approx(tests[1000, 0] / 1e6)


def test_batched_bench_jsonl_gives_the_time_of_one_step_of_8_tokens() -> None:
    text = (DATA / "batched-bench.out").read_text()
    row = next(json.loads(line) for line in text.splitlines() if line.startswith("{"))
    assert row["pl"] == 8
    assert bench.parse_batched_bench(text) == {"batch8_ms": pytest.approx(1e3 * row["t_tg"] / row["tg"])}
    with pytest.raises(ValueError, match="no llama-batched-bench result for 4"):
        bench.parse_batched_bench(text, batch=4)


def test_swarm_bench_json_gives_the_same_measures_its_device_and_the_machine_s_rate() -> None:
    figures, device = bench.parse_swarm_bench((DATA / "swarm-bench-engine.json").read_text())
    assert set(figures) == {m.key for m in bench.MEASURES} | {"ceiling_g", "ceiling_bits", "ceiling_share"}
    r = json.loads((DATA / "swarm-bench-engine.json").read_text())
    assert figures["batch8_ms"] == r["steps"][-1]["step_ms"] and r["steps"][-1]["batch"] == 8
    assert device == r["device"]
    assert figures["ceiling_g"] == r["multiply_ceiling"]["8"] / 1e9 and figures["ceiling_bits"] == 8
    assert figures["ceiling_share"] == r["prefill_ceiling_share"]
    # the GPU family measures no ceiling: the measures alone
    del r["multiply_ceiling"], r["prefill_ceiling_share"]
    figures, _ = bench.parse_swarm_bench(json.dumps(r))
    assert set(figures) == {m.key for m in bench.MEASURES}


def test_the_footer_gives_each_round_s_ceiling_and_the_prefill_s_share_of_it() -> None:
    rounds = {"ceiling_g": [746.8, 615.4], "ceiling_bits": [8, 8], "ceiling_share": [0.46, 0.452], "prefill_tok_s": [263.6, 187.0]}
    results = {"qwen2.5-coder-1.5b": {"slotswarm": rounds, "llama.cpp": {}}, "gpu-model": {"slotswarm": {}, "llama.cpp": {}}}
    assert bench.format_ceilings(results) == [
        "qwen2.5-coder-1.5b: slotswarm's multiply ceiling by round 747, 615 G 8-bit products/s; its prefill at 46, 45% of it"
    ]


def test_the_ratio_reads_as_how_much_faster_slotswarm_is() -> None:
    step, prefill = bench.MEASURES[0], bench.MEASURES[2]
    assert bench.ratio(step, slotswarm=10.0, llama=20.0) == "2.00x faster"
    assert bench.ratio(step, slotswarm=30.0, llama=20.0) == "1.50x slower"
    assert bench.ratio(prefill, slotswarm=300.0, llama=200.0) == "1.50x faster"
    assert bench.ratio(prefill, slotswarm=100.0, llama=200.0) == "2.00x slower"


def test_the_table_has_one_row_per_model_and_measure_with_medians_and_ranges() -> None:
    ours, _ = bench.parse_swarm_bench((DATA / "swarm-bench-engine.json").read_text())
    theirs = bench.parse_llama_bench((DATA / "llama-bench.json").read_text())
    theirs.update(bench.parse_batched_bench((DATA / "batched-bench.out").read_text()))
    rounds = {"slotswarm": {k: [v, 2 * v, 3 * v] for k, v in ours.items()}, "llama.cpp": {k: [v] for k, v in theirs.items()}}
    results = {"smollm2-135m": rounds}
    table = bench.format_table(results).splitlines()
    assert len(table) == 2 + len(bench.MEASURES)
    step = next(line for line in table if "batch 1 step" in line)
    median = 2 * ours["batch1_ms"]
    assert f"{median:,.1f} ({ours['batch1_ms']:,.1f}-{3 * ours['batch1_ms']:,.1f})" in step
    assert step.endswith(bench.ratio(bench.MEASURES[0], median, theirs["batch1_ms"]) + " |")


def test_the_wrapper_says_its_options_without_fetching_or_building(tmp_path: Path) -> None:
    import subprocess

    cache = tmp_path / "cache"
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "llamacpp-bench.sh"), "--rounds", "2", "--help"],
        env={"PATH": "/usr/bin:/bin", "LLAMACPP_CACHE": str(cache), "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "--rounds" in done.stdout, done.stderr
    assert not cache.exists()


@pytest.mark.parametrize("isa", ["native", "avx2", "avx2-vnni"])
def test_avx2_runs_slotswarm_on_pocl_s_avx2_library_with_or_without_vnni(isa: str, tmp_path: Path, monkeypatch, capsys) -> None:
    outputs = {
        "llama-bench": (DATA / "llama-bench.json").read_text(),
        "llama-batched-bench": (DATA / "batched-bench.out").read_text(),
        sys.executable: (DATA / "swarm-bench-engine.json").read_text(),
    }
    environments = []

    def run(cmd: list[str], environment: dict[str, str] | None = None) -> str:
        if cmd[0] == sys.executable:
            environments.append(environment)
        return outputs[cmd[0] if cmd[0] == sys.executable else Path(cmd[0]).name]

    monkeypatch.setattr(bench, "run", run)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    out = tmp_path / "rounds.json"
    assert bench.main(["--bin", str(tmp_path), "--models", str(gguf), "--rounds", "2", "--isa", isa, "--out", str(out)]) == 0
    avx2 = {"POCL_KERNELLIB_NAME": "avx2"}
    expected = {"native": {}, "avx2": {**avx2, "SLOTSWARM_VNNI": "0"}, "avx2-vnni": avx2}[isa]
    assert environments == [expected, expected]
    record = json.loads(out.read_text())
    device = json.loads(outputs[sys.executable])["device"]
    assert record["isa"] == isa and record["devices"] == [device]
    printed = capsys.readouterr().out
    assert f"instructions: {isa}; slotswarm's device: {device}" in printed
    assert f"{gguf}: slotswarm's multiply ceiling by round" in printed


def test_the_wrapper_refuses_an_unknown_isa_before_fetching_or_building(tmp_path: Path) -> None:
    import subprocess

    cache = tmp_path / "cache"
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "llamacpp-bench.sh"), "--isa", "avx512"],
        env={"PATH": "/usr/bin:/bin", "LLAMACPP_CACHE": str(cache), "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--isa must be native, avx2 or avx2-vnni, got 'avx512'" in done.stderr
    assert not cache.exists()
