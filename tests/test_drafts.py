"""Speculative decoding's pure parts (runtime.scheduling.drafts): prompt lookup,
the acceptance rule, the acceptance rate and the cost law's choice of drafts."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.scheduling.cost import StepCost
from runtime.scheduling.drafts import (
    LONGEST,
    MODEL,
    MODEL_PRIOR_RATE,
    PRIOR_RATE,
    RESYNC,
    DraftCost,
    Lookup,
    Rate,
    Rates,
    accept,
    drafts_that_pay,
    expected_kept,
    proposal,
    propose,
)


def test_lookup_proposes_what_followed_the_longest_most_recent_match():
    #          0  1  2  3  4  5  6  7  8  9 10 11
    tokens = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3]
    # [1, 2, 3] occurred at 0..2: the trigram wins over the later [2, 3] at 6..7
    assert propose(tokens, 4) == [4, 5, 9, 2]
    assert propose([5, 6, 7, 6, 7], 2) == [6, 7]  # [6, 7] at 1..2, then [6, 7]
    assert propose([7, 1, 8, 1], 3) == [8, 1]  # only a unigram matches; what follows is all there is
    assert propose([1, 2, 3], 4) == [] and propose([], 4) == [] and propose([4], 4) == []
    assert propose([4, 4, 4, 4], 3) == [4]  # the most recent earlier [4, 4, 4] ends just before the suffix
    lookup = Lookup()
    lookup.extend(tokens)
    assert lookup.proposal(2) == ([4, 5], 3)  # and the length of the match it follows
    lookup.extend([8])
    assert lookup.proposal(2) == ([1, 2], 1)
    lookup.extend([6])
    assert lookup.proposal(2) == ([], 0)


def test_lookup_goes_on_with_the_copy_it_follows_past_a_replaced_token():
    """An edited function is its original with a few tokens replaced: after
    the replacement the copy goes on where it was (a guess with its own rate,
    RESYNC), and a run that keeps matching is not taken over by a later
    occurrence of its last few tokens."""
    original = list(range(10, 30))
    tokens = [*original, 99, *original[:6], 77]  # the copy's 7th token replaced by 77
    lookup = Lookup()
    lookup.extend(tokens)
    assert lookup.proposal(3) == (original[7:10], RESYNC) == proposal(tokens, 3)
    lookup.extend([original[7]])
    assert lookup.proposal(3) == (original[8:11], 7)  # back in the copy, 7 tokens matched
    lookup.extend([78, 79])  # two more changes in a row: no copy to follow
    assert lookup.proposal(3) == ([], 0) == proposal([*tokens, original[7], 78, 79], 3)
    # [1, 2, 3, 4] last occurred before 30, 31; the copy of `source` follows it with 20, 21
    source = [10, 11, 12, 13, 1, 2, 3, 4, 20, 21]
    tokens = [*source, 5, 1, 2, 3, 4, 30, 31, 6, *source[:8]]
    assert proposal(tokens, 2) == ([20, 21], 8)
    lookup = Lookup()
    lookup.extend(tokens[:12])
    lookup.extend(tokens[12:])
    assert lookup.proposal(2) == ([20, 21], 8)


def test_a_token_a_copy_replaced_is_replaced_further_on_until_a_copy_keeps_it():
    """A renamed variable: once the copy went on after `count` written as
    `kept`, lookup drafts `kept` where the copy has `count` again; a copy that
    writes `count` there after all ends the rename."""
    count, kept = 50, 60
    original = [10, 11, 12, 13, count, 14, 15, 16, 17, count, 18, 19]
    tokens = [*original, 99, *original[:4], kept, 14]
    lookup = Lookup()
    lookup.extend(tokens)
    assert lookup.renamed == {count: kept}
    assert lookup.proposal(5) == ([15, 16, 17, kept, 18], 5) == proposal(tokens, 5)
    tokens += [15, 16, 17, count]  # (kept `count` after all)
    lookup.extend(tokens[-4:])
    assert lookup.renamed == {} and lookup.proposal(2) == ([18, 19], 9) == proposal(tokens, 2)


def test_lookup_indexes_only_the_latest_tokens_of_a_long_first_batch():
    from runtime.scheduling.drafts import LOOKBACK

    tokens = [7, 8, 9, 5] + [1, 2] * LOOKBACK + [3, 7, 8]
    lookup = Lookup()
    lookup.extend(tokens)
    assert lookup.fed == len(tokens) and len(lookup.tokens) == LOOKBACK
    assert propose(tokens, 2) == [9, 5]  # [7, 8] at the start...
    assert lookup.proposal(2) == ([], 0)  # ...is past the window
    lookup.extend([3, 7, 8])
    assert lookup.fed == len(tokens) + 3 and lookup.proposal(2) == ([3, 7], 3)  # [7, 8] in it, now


@settings(max_examples=300, deadline=None)
@given(tokens=st.lists(st.integers(0, 5), max_size=40), k=st.integers(1, 6), cut=st.integers(0, 40))
def test_the_incremental_index_proposes_what_the_plain_search_does(tokens, k, cut):
    lookup = Lookup()
    lookup.extend(tokens[:cut])
    assert lookup.propose(k) == propose(tokens[:cut], k)
    lookup.extend(tokens[cut:])
    assert lookup.propose(k) == propose(tokens, k)


@settings(max_examples=300, deadline=None)
@given(
    truth=st.lists(st.integers(0, 3), min_size=9, max_size=9),
    drafts=st.lists(st.integers(0, 3), min_size=0, max_size=8),
)
def test_acceptance_yields_exactly_the_tokens_sampled_one_at_a_time(truth, drafts):
    """A row's token is what the turn samples there given the tokens before it;
    rows after a wrong draft see a wrong sequence (here: garbage). What `accept`
    keeps is always a prefix of the tokens sampled without drafts, at least one."""
    sampled, right = [], True
    for i in range(len(drafts) + 1):
        sampled.append(truth[i] if right else 99)  # a row past a wrong draft sees garbage
        right = right and i < len(drafts) and drafts[i] == truth[i]
    kept = accept(drafts, sampled)
    assert 1 <= len(kept) <= len(drafts) + 1 and kept == truth[: len(kept)]
    n = next((i for i, d in enumerate(drafts) if d != truth[i]), len(drafts))
    assert len(kept) == n + 1  # every right draft kept, and the token after them


def test_the_rate_follows_what_is_kept():
    rate = Rate()
    assert rate.value == PRIOR_RATE
    for _ in range(20):
        rate.note(4, 4)
    assert rate.value > 0.9
    for _ in range(20):
        rate.note(4, 0)
    assert rate.value < 0.1
    for _ in range(20):
        rate.note(1, 1)
    assert rate.value > 0.3


def test_drafts_pay_where_rows_are_nearly_free_and_only_likely_ones_where_they_cost():
    assert expected_kept(0.5, 0) == 1 and expected_kept(0.5, 2) == 1.75
    gpu = StepCost(fixed_s=1e-3, token_s=1e-7)  # a batch costs about one turn
    cpu = StepCost(fixed_s=60e-3, token_s=23e-3)  # every row costs a token's compute
    assert drafts_that_pay(gpu, 0.6, 8, 0, 0, 100) == 8
    assert drafts_that_pay(gpu, 0.0, 8, 0, 0, 100) == 0  # nothing is ever kept: never
    assert drafts_that_pay(cpu, 0.1, 8, 0, 0, 100) == 0
    assert 3 <= drafts_that_pay(cpu, 0.9, 8, 0, 0, 100) <= 8
    # beside a big step (a batch-mate's work), the same rows cost relatively less
    assert drafts_that_pay(cpu, 0.5, 8, 60, 0, 100) > drafts_that_pay(cpu, 0.5, 8, 0, 0, 100)
    assert drafts_that_pay(cpu, 0.9, 0, 0, 0, 100) == 0


def test_a_draft_models_steps_are_counted_and_its_first_read_shared_out():
    """A draft model's drafts cost its steps: on a GPU a small draft model's
    step is cheap beside the target's and a likely draft pays; on a CPU, beside
    rows that cost a token's compute each, a draft model half the target's
    cost pays one draft at most, and only a likely one. Its one-off read of the context is shared over the tokens the turn
    may still decode: a short turn does not pay for it, a long one does."""
    gpu = StepCost(fixed_s=10e-3, token_s=1e-6)
    cpu = StepCost(fixed_s=60e-3, token_s=23e-3)
    small_gpu = DraftCost(step_s=2e-3, catch_up_s=2e-3)
    assert drafts_that_pay(gpu, 0.8, 8, 0, 0, 100, small_gpu) >= 4
    assert drafts_that_pay(gpu, 0.8, 8, 0, 0, 100, DraftCost(step_s=20e-3, catch_up_s=20e-3)) == 0  # slower than the target
    half_cpu = DraftCost(step_s=40e-3, catch_up_s=40e-3)
    assert drafts_that_pay(cpu, 0.8, 8, 0, 0, 100, half_cpu) == 1
    assert drafts_that_pay(cpu, 0.6, 8, 0, 0, 100, half_cpu) == 0
    read = 2.0  # the draft model's prefill of a long context
    assert drafts_that_pay(gpu, 0.8, 8, 0, 0, 100, DraftCost(2e-3, 2e-3, read, remaining=10)) == 0
    assert drafts_that_pay(gpu, 0.8, 8, 0, 0, 100, DraftCost(2e-3, 2e-3, read, remaining=100_000)) >= 4


def _copy(rates: Rates, runs: list[int]) -> None:
    """Copies found by a 4-gram match, each of which kept its first `run`
    guesses and refused the next (16: it went on), noted token by token as
    accounting notes them."""
    for run in runs:
        for i in range(min(run + 1, 16)):
            rates.note(LONGEST + i, 1, i < run)


def test_a_long_run_is_priced_by_its_length_until_the_turns_own_runs_say_otherwise():
    rates = Rates()
    first = rates.chain(LONGEST, 16)
    assert first[0] == PRIOR_RATE and first == sorted(first) and first[-1] > 0.9  # (the rule of succession)
    assert rates.chain(RESYNC, 3)[0] == PRIOR_RATE and rates.chain(MODEL, 3) == [MODEL_PRIOR_RATE] * 3
    _copy(rates, [5] * 10)  # every copy broken once it has matched 9 tokens
    assert rates.of(9) < 0.3 and rates.of(8) > 0.9 and rates.of(LONGEST) > 0.8
    assert drafts_that_pay(StepCost(fixed_s=30.5e-3, token_s=10e-3), rates.chain(LONGEST, 16), 16, 0, 0, 300) == 5


def test_a_copy_kept_or_broken_as_a_run_makes_long_drafts_pay_and_independent_drafts_do_not():
    """Two turns keep about the same share of their first guesses. One keeps
    its copies as runs, kept whole or broken at once; the other keeps each
    guess independently of the one before. On a CPU law, where each row
    costs a token's compute, the runs make the longest drafts pay; the
    independent guesses are priced as one rate for all prices them."""
    cpu = StepCost(fixed_s=30.5e-3, token_s=10e-3)
    clustered, independent = Rates(), Rates()
    _copy(clustered, [16, 0, 16, 0, 16, 16, 0, 16, 0, 16] * 3)
    draw = random.Random(7)
    _copy(independent, [next((i for i in range(16) if draw.random() > 0.62), 16) for _ in range(30)])
    assert abs(clustered.of(LONGEST) - independent.of(LONGEST)) < 0.15
    assert drafts_that_pay(cpu, clustered.chain(LONGEST, 16), 16, 0, 0, 300) == 16
    flat = drafts_that_pay(cpu, independent.of(LONGEST), 16, 0, 0, 300)
    assert flat < 8 and abs(drafts_that_pay(cpu, independent.chain(LONGEST, 16), 16, 0, 0, 300) - flat) <= 1
    assert expected_kept([0.5, 1.0, 1.0], 3) == 2.5 and expected_kept(0.5, 2) == expected_kept([0.5, 0.5], 2)


def test_a_match_length_not_tried_yet_is_priced_as_the_shorter_one():
    """Free text: its single-token guesses mostly fail, and its longer matches
    are too rare to have a rate of their own; they are not priced at the
    prior as if nothing were known, so a cheap-row law drafts nothing."""
    rates = Rates()
    for i in range(30):
        rates.note(1, 1, i % 6 == 0)
    assert rates.of(2) == rates.of(3) == rates.of(LONGEST) == rates.of(1) < 0.3
    cheap_rows = StepCost(fixed_s=32e-3, token_s=7e-3)
    assert drafts_that_pay(cheap_rows, rates.chain(1, 16), 16, 0, 0, 300) == 0
