"""`swarm bench serve` on the tiny model: a real server process, the openai client,
the JSON schema, and figures that agree with their samples."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from runtime.errors import ConfigError
from swarm.bench import serve as bench_serve

PERCENTILES = ("p50", "p90", "p99", "max")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_serve.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_a_short_run_over_http_and_in_process(tiny_gguf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(
        "--model",
        str(tiny_gguf),
        "--seconds",
        "2",
        "--slots",
        "2",
        "--fg-interval",
        "0.1",
        "--fg-tokens",
        "4",
        "--bg-max",
        "48",
        "--prompt",
        "40",
        "--json",
    )
    assert bench_serve.run(args) == 0
    data = json.loads(capsys.readouterr().out)
    http = data["http"]
    assert http["bg_streams_started"] == 2 and http["bg_tok_per_s"] > 0 and http["seconds"] >= 2
    assert http["fg_turns"] == len(http["fg_ttft_samples_s"]) == len(http["fg_server_ttft_samples_s"]) > 0
    for key in ("fg_ttft_s", "fg_itl_s", "fg_server_ttft_s", "fg_wait_s"):
        assert set(http[key]) == set(PERCENTILES), key
        assert http[key]["p50"] <= http[key]["p90"] <= http[key]["p99"] <= http[key]["max"]
    samples = http["fg_ttft_samples_s"]
    assert http["fg_ttft_s"]["max"] == pytest.approx(max(samples))
    assert http["fg_ttft_s"]["p50"] == pytest.approx(float(np.percentile(samples, 50)))
    # The client's time to first token holds the server's own, plus the HTTP round trip.
    assert all(c >= s for c, s in zip(samples, http["fg_server_ttft_samples_s"], strict=False))
    local = data["in_process"]
    assert local["fg_turns"] > 0 and set(local["fg_ttft_s"]) == set(PERCENTILES)
    assert data["fg_ttft_p99_vs_in_process"] == pytest.approx(http["fg_ttft_s"]["p99"] / local["fg_ttft_s"]["p99"])


def test_bad_flags_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="--seconds"):
        bench_serve.run(parse("--seconds", "0"))
    with pytest.raises(ConfigError, match="policy"):
        bench_serve.run(parse("--policy", "lifo"))
