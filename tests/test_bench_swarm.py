"""`swarm bench swarm` on the tiny model: the JSON schema, and figures that agree
with the raw samples they came from."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from runtime.errors import ConfigError
from swarm.bench import swarm as bench_swarm
from swarm.viewers.plot import plot_bench

PERCENTILES = ("p50", "p90", "p99", "max")


@pytest.fixture(scope="module")
def tiny_engine(tiny_gguf: Path):
    from gpu.engine import OpenCLEngine

    return OpenCLEngine(tiny_gguf)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_swarm.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_a_short_run_reports_every_policy_in_the_documented_schema(tiny_engine, capsys, tmp_path):
    args = parse(
        "--seconds",
        "2",
        "--policies",
        "resident,priority,resident:unshaped",
        "--slots",
        "3",
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
    assert bench_swarm.run(args, engine=tiny_engine) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["policies"]) == {"resident", "priority", "resident:unshaped"}
    assert data["workload"]["slots"] == 3
    for name, r in [*data["policies"].items(), ("solo", data["solo"])]:
        tokens = r["fg_token_times_s"]
        assert r["fg_turns"] == len(tokens) == len(r["fg_turn_samples_s"]) > 0, name
        assert all(len(t) == 4 for t in tokens)  # every token of every turn, timed
        gaps = [b - a for t in tokens for a, b in zip(t, t[1:], strict=False)]
        for key, samples in (("fg_ttft_s", [t[0] for t in tokens]), ("fg_itl_s", gaps), ("fg_turn_s", [t[-1] for t in tokens])):
            assert set(r[key]) == set(PERCENTILES)
            assert r[key]["max"] == pytest.approx(max(samples))
            assert r[key]["p50"] == pytest.approx(float(np.percentile(samples, 50)))
            assert r[key]["p50"] <= r[key]["p90"] <= r[key]["p99"] <= r[key]["max"]
    for name, r in data["policies"].items():
        waits, ttfts = r["fg_wait_samples_s"], r["fg_ttft_samples_s"]
        assert r["fg_turns"] == len(waits) == len(ttfts) > 0, name
        assert set(r["fg_wait_s"]) == set(PERCENTILES)
        assert all(t >= w for w, t in zip(waits, ttfts, strict=False))  # the first token comes after the slot
        assert r["bg_tok_per_s"] > 0 and r["step_s_median"] > 0 and r["seconds"] >= 2
        assert isinstance(r["preemptions"], int) and r["paused_s"] >= 0
        assert r["vs_solo"]["turn_p50"] > 0 and r["vs_solo"]["ttft_p99"] > 0 and r["vs_solo"]["itl_p50"] > 0
    # A solo run of each policy's turns, right after it; `solo` pools them.
    assert data["solo"]["fg_turns"] == sum(r["fg_turns"] for r in data["policies"].values())
    assert data["policies"]["priority"]["preemptions"] == 0  # it orders the queue, never preempts
    assert data["policies"]["priority"]["abandoned_steps"] == 0  # nor stops a step
    assert data["policies"]["resident"]["preemptions"] > 0  # every slot was busy when the foreground came
    assert plot_bench(data, tmp_path / "bench.png").is_file()  # swarm plot reads it


def test_bad_policies_and_durations_are_config_errors(tiny_engine):
    with pytest.raises(ConfigError, match="unknown policy 'fast'"):
        bench_swarm.run(parse("--policies", "resident,fast"), engine=tiny_engine)
    with pytest.raises(ConfigError, match="a variant is written"):
        bench_swarm.run(parse("--policies", "resident:fast"), engine=tiny_engine)
    with pytest.raises(ConfigError, match="no draft model is known for tiny"):
        bench_swarm.run(parse("--policies", "resident,resident:draft"), engine=tiny_engine)
    with pytest.raises(ConfigError, match="--seconds must be positive"):
        bench_swarm.run(parse("--seconds", "0"), engine=tiny_engine)
