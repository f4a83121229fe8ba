"""`swarm sim`: the simulator's claims, on small but real runs (virtual time)."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from runtime.errors import ConfigError
from runtime.scheduling.turns import Policy
from swarm import sim
from swarm.cli import main
from swarm.commands.sim import split
from swarm.sim import POLICIES, Result, Tally, load_workload, simulate


@pytest.mark.parametrize("dist", ["lognormal", "pareto"])
def test_resident_caps_the_foreground_wait_at_one_step_plus_the_flush(dist):
    workload = load_workload(None, arrivals=300, **{"background.dist": dist})
    # The longest step there can be: a full token budget, every slot at its longest context.
    longest = workload.background_prompt + workload.background.max + workload.foreground_prompt + workload.foreground.max
    step = workload.timing.cost().predict(workload.step_tokens, workload.slots * longest)
    flush = workload.timing.flush_s
    resident = simulate(workload, "resident").summary()["fg_wait_s"]
    priority = simulate(workload, "priority").summary()["fg_wait_s"]
    assert resident["p99"] <= step + flush + 1e-9
    # A wait can start inside a step that itself paid a flush: at most one more.
    assert resident["max"] <= step + 2 * flush + 1e-9
    # Without preemption the wait follows the background turn lengths.
    assert priority["p50"] > 10 * resident["p99"]
    assert priority["max"] > 1.0


CPU = {"timing.decode_step_s": 0.010, "timing.prefill_tok_per_s": 400.0, "timing.kv_read_s": 2e-8}  # TimingModel.cpu()


def test_a_foreground_arrival_stops_the_background_step_it_lands_in():
    # On a CPU a step of eight decodes costs three of one: most background steps are
    # worth stopping, and the wait is two of a step's CHECK_POINTS groups, not its rest.
    on = simulate(load_workload(None, arrivals=300, **CPU), "resident")
    off = simulate(load_workload(None, arrivals=300, abandon_steps=False, **CPU), "resident")
    assert on.abandoned_steps > 100 and off.abandoned_steps == 0
    assert on.summary()["fg_wait_s"]["p50"] < off.summary()["fg_wait_s"]["p50"] / 2
    # What the stopped steps had done is lost, but it is little.
    assert on.summary()["bg_tok_per_s"] > 0.99 * off.summary()["bg_tok_per_s"]
    # On a GPU a batch of decodes costs about one: only steps with a prefill chunk are.
    gpu = simulate(load_workload(None, arrivals=300), "resident")
    assert 0 < gpu.abandoned_steps < on.abandoned_steps / 10
    # The non-preempting policies never stop a step.
    assert simulate(load_workload(None, arrivals=100, **CPU), "priority").abandoned_steps == 0


def test_swap_and_recompute_pay_for_their_resumes():
    workload = load_workload(None, arrivals=200)
    swap, recompute, resident = (simulate(workload, p) for p in ("swap", "recompute", "resident"))
    assert swap.swapped_bytes > 0 and recompute.recomputed_tokens > 0
    assert resident.swapped_bytes == 0 and resident.recomputed_tokens == 0
    assert max(swap.fg_waits) >= max(resident.fg_waits)


def test_a_seed_makes_a_run_reproducible():
    workload = load_workload(None, arrivals=100, seed=7)
    assert simulate(workload, "priority").fg_waits == simulate(workload, "priority").fg_waits
    other = load_workload(None, arrivals=100, seed=8)
    assert simulate(other, "priority").fg_waits != simulate(workload, "priority").fg_waits


def test_json_output_has_the_documented_shape(capsys):
    assert main(["sim", "--arrivals", "50", "--policies", "priority,resident", "--json", "--jobs", "1", "--slots", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["workload"]["slots"] == 4 and out["workload"]["arrivals"] == 50
    for name in ("priority", "resident"):
        policy = out["policies"][name]
        assert set(policy["fg_wait_s"]) == {"p50", "p90", "p99", "max"}
        assert policy["bg_tok_per_s"] > 0 and isinstance(policy["preemptions"], int)


def test_processes_share_the_policies_out_evenly_and_report_what_one_would(capsys):
    seed = load_workload(None)
    # The cache-filing recompute and one more preempting policy; the rest together.
    assert split(seed, POLICIES, 2) == [["fcfs", "priority", "swap"], ["recompute", "resident"]]
    assert split(seed, POLICIES, 9) == [[p] for p in POLICIES]
    for jobs in (1, 2, 3):
        shares = split(load_workload(None, prefix_share=0.5), POLICIES, jobs)
        assert len(shares) <= jobs and sorted(p for share in shares for p in share) == sorted(POLICIES)
    args = ["sim", "--arrivals", "20", "--policies", "fcfs,recompute,resident", "--json", "--slots", "4"]
    outputs = []
    for jobs in ("1", "2"):
        assert main([*args, "--jobs", jobs]) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[0] == outputs[1]


def test_a_workload_file_sets_fields_and_names_bad_ones(tmp_path):
    good = tmp_path / "w.toml"
    good.write_text("slots = 4\narrivals = 10\n[background]\ndist = 'pareto'\nalpha = 1.3\n")
    workload = load_workload(good)
    assert (workload.slots, workload.background.dist, workload.background.alpha) == (4, "pareto", 1.3)
    bad = tmp_path / "bad.toml"
    bad.write_text("slots = 4\nslotz = 5\n")
    with pytest.raises(ConfigError, match="slotz"):
        load_workload(bad)
    with pytest.raises(ConfigError, match="unknown policy"):
        simulate(workload, "lottery")


def test_a_prefix_share_is_reused_and_recompute_hits_the_cache():
    def run(cache: bool):
        workload = load_workload(None, arrivals=60, background_prompt=512, prefix_share=0.75, prefix_cache=cache)
        return simulate(workload, "recompute")

    on, off = run(True), run(False)
    assert off.summary()["prompt_reused"] == 0
    # 384 of 512 tokens repeat: 24 whole blocks; every agent's first turn misses.
    assert 0.6 < on.summary()["prompt_reused"] <= 0.75
    # A turn recomputed after a pause finds its own blocks still cached.
    assert on.recomputed_tokens < off.recomputed_tokens / 10
    with pytest.raises(ConfigError, match="prefix_share"):
        simulate(load_workload(None, arrivals=1, prefix_share=1.5), "resident")


# What the seed workload decides, at 150 arrivals, without and with shared prompts:
# steps, preemptions, stopped steps, background tokens, prompt tokens, of those
# cached, tokens recomputed, bytes swapped, and the sums of the foreground's
# waits, times to first token, gaps between tokens and turn times. Work that only
# makes the simulator faster must leave every figure as it is.
PINNED = {
    0.0: {
        "fcfs": (62573, 0, 0, 464427, 103296, 0, 0, 0, 223.705242, 229.743959, 516.043971, 745.78793),
        "priority": (62579, 0, 0, 464480, 103360, 0, 0, 0, 177.626532, 183.625283, 516.173646, 699.79893),
        "recompute": (62522, 146, 2, 463539, 103104, 0, 285, 0, 2.664637, 8.651908, 515.040581, 523.692489),
        "swap": (62510, 149, 3, 463442, 103104, 0, 0, 4816633856, 2.783724, 8.796315, 515.262292, 524.058607),
        "resident": (62522, 146, 2, 463539, 103104, 0, 0, 0, 2.664637, 8.651908, 515.040581, 523.692489),
    },
    0.5: {
        "fcfs": (62957, 0, 0, 467267, 103744, 51360, 0, 0, 232.830978, 237.867545, 513.575389, 751.442934),
        "priority": (62956, 0, 0, 467259, 103744, 51360, 0, 0, 191.761569, 196.792271, 513.62665, 710.418921),
        "recompute": (62894, 144, 2, 466523, 103680, 51328, 219, 0, 2.65356, 7.683925, 513.184411, 520.868336),
        "swap": (62884, 143, 4, 466436, 103680, 51328, 0, 4329963520, 2.833162, 7.875924, 513.383628, 521.259552),
        "resident": (62894, 144, 2, 466523, 103680, 51328, 0, 0, 2.65356, 7.683925, 513.184411, 520.868336),
    },
}


@pytest.mark.parametrize("share", PINNED)
def test_the_decisions_of_a_small_run_are_pinned(share):
    workload = load_workload(None, arrivals=150, prefix_share=share)
    for policy, pinned in PINNED[share].items():
        r = simulate(workload, policy)
        sums = tuple(round(float(sum(x)), 6) for x in (r.fg_waits, r.fg_ttft, r.fg_itl, r.fg_turn))
        counts = (r.steps, r.preemptions, r.abandoned_steps, r.bg_tokens, r.prompt_tokens, r.cached_tokens)
        counts += (r.recomputed_tokens, r.swapped_bytes)
        assert (*counts, *sums) == pinned, policy


# Every sample of the same runs, bit for bit (each wait, first token, gap and
# turn time as the float it is, not a rounded sum): a digest of the whole result.
DIGESTS = {
    0.0: {
        "fcfs": "1a971113893ab0e7",
        "priority": "56bf44faccea31d2",
        "recompute": "bdfde2b395d82479",
        "swap": "46189e9a4d55b2ea",
        "resident": "ea9943c5f6cfd43c",
    },
    0.5: {
        "fcfs": "831e9b32c410be39",
        "priority": "5a40ccf9599961ce",
        "recompute": "11d5108c9ea4a581",
        "swap": "06cfe3720c3a51be",
        "resident": "fb17dd76722b8a21",
    },
}


@pytest.mark.parametrize("share", DIGESTS)
def test_every_sample_of_a_small_run_is_pinned(share):
    workload = load_workload(None, arrivals=150, prefix_share=share)
    for policy, digest in DIGESTS[share].items():
        result = json.dumps(dataclasses.asdict(simulate(workload, policy)))  # (repr of a float round-trips exactly)
        assert hashlib.sha256(result.encode()).hexdigest()[:16] == digest, policy


@pytest.mark.parametrize("policy", POLICIES)
def test_a_cache_that_cannot_hit_is_left_out_and_decides_nothing(policy, monkeypatch):
    # Without shared prompts only a recomputed turn can find K/V in the cache (its
    # own): every other policy runs without one, to the same events and samples.
    workload = load_workload(None, arrivals=60, background_prompt=100, **{"background.mean": 120.0})
    assert sim.may_hit(workload, Policy(policy)) == (policy == "recompute")
    assert sim.may_hit(load_workload(None, prefix_share=0.1), Policy(policy))

    def run() -> tuple[list, str]:
        events: list = []
        result = json.dumps(dataclasses.asdict(simulate(workload, policy, events=events.append)))
        return events, result

    left_out = run()
    monkeypatch.setattr(sim, "may_hit", lambda workload, policy: True)
    assert run() == left_out


@pytest.mark.parametrize("policy", POLICIES)
def test_the_fast_forward_makes_the_decisions_of_every_step(policy):
    # Skipping ahead (Scheduler.repeatable) stands one plan for many steps: the
    # same events, for the same turns, at the same steps and slots, as planning
    # every step, at the same times but for rounding.
    workload = load_workload(None, arrivals=20)
    logs: dict[bool, list] = {True: [], False: []}
    for fast in logs:
        simulate(workload, policy, events=logs[fast].append, fast_forward=fast)
    skipped, stepped = logs[True], logs[False]
    assert [(type(e), e.turn, e.step, e.slot) for e in skipped] == [(type(e), e.turn, e.step, e.slot) for e in stepped]
    assert all(e.t == pytest.approx(f.t, abs=1e-9) for e, f in zip(skipped, stepped, strict=True))


def test_a_recompute_hit_counts_as_no_prompt_reuse_whether_or_not_its_turn_ends():
    # A recompute's cache hits are in its turn's end count too, but they found no
    # prompt's tokens: taken out at the end, never before (a turn still live when
    # the simulation stops, as background turns are, has no end to net them against).
    from runtime.events.kinds import Admitted, Finished, Queued, Recomputed

    about = {"t": 0.0, "step": 0, "agent": "bg", "priority": 0}
    result = Result("recompute")
    tally = Tally(result)
    for turn in (1, 2):
        tally.count(Queued(turn=turn, tokens=100, **about))
        tally.count(Admitted(turn=turn, cached_tokens=30, **about))
        tally.count(Recomputed(turn=turn, tokens=50, cached_tokens=40, **about))
    tally.count(Finished(turn=1, tokens=10, reason="length", cached_tokens=30 + 40, **about))  # turn 2 is still live
    assert result.summary()["prompt_reused"] == 30 / 200
    assert result.recomputed_tokens == 100
