"""The steps in flight: what steps launched and not yet landed will add to their turns.

The GPU owner plans step N+1 while step N runs (runtime.owner.flight), as vLLM's
async scheduling and SGLang's overlap scheduler do. A turn holds only settled
facts: its `output` is the tokens sampled so far, its `computed` the positions
whose K/V has landed. What a step in flight will add is kept here, in the one
place the scheduler owns: entered when the step is launched (`launch`), applied
to its turns when it lands (`land`, from the scheduler's postprocess), and
simply forgotten when it is abandoned (`discard`).

Planning asks for a turn one step ahead: its K/V as it stands once the steps in
flight land (`computed`), its length with the tokens they sample (`length`),
what it still has to feed (`pending`), and how many of its tokens are not known
yet (`sampling`). A decode planned on a token a step in flight samples says so
on its Work (`Work.follows`); whoever runs the steps puts that token there.

The ledger is the launched plans, each with what its work adds to each of its
turns (`Ahead`, made once as it is launched): a turn's share is their sum,
taken when asked, so landing a step costs nothing per turn.

A turn whose K/V is dropped while a step writes it (`forget_kv`) keeps nothing
of what that step writes: its positions count for nothing when it lands.

A decode that verifies drafts (runtime.scheduling.drafts) keeps 1 to drafts + 1
of the positions it writes and tokens it samples, which only its landing tells.
The ledger counts all of them (so a swap-out planned meanwhile copies every
position that may count), and the turn is `verifying` until it lands: nothing
is planned on it, since its next position is not known.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from runtime.scheduling.turns import Plan, Turn


class Ahead(msgspec.Struct, frozen=True, gc=False):
    """One turn's share of the steps in flight (shared by whoever asks: never changed)."""

    positions: int = 0  # positions they write past turn.computed (that still count)
    tokens: int = 0  # tokens they sample for it, not known yet (at most, if verifying)
    verifying: int = 0  # its works in flight that verify drafts: how many it keeps is not known

    def pending(self, turn: Turn) -> int:
        """InFlight.pending, for the turn this is the share of."""
        return len(turn.prompt) + len(turn.output) + self.tokens - turn.computed - self.positions


SETTLED = Ahead()  # the share of a turn with nothing in flight (shared: never changed)
DECODE = Ahead(1, 1)  # a decode's share: one position, one token (shared likewise)
NOTHING: frozenset[Turn] = frozenset()


@dataclass(slots=True)
class _Launched:
    plan: Plan
    shares: dict[Turn, Ahead]  # what its work adds, for each of its turns (at most one work a turn)
    # Turns whose K/V was dropped since the launch: what it writes for them is lost.
    void: set[Turn] | frozenset[Turn] = NOTHING


class InFlight:
    def __init__(self) -> None:
        # Oldest first. Whoever asks whether any step is in flight reads its truth
        # (a list's costs no call, asked for every step): do not change it.
        self.launched: list[_Launched] = []

    def __len__(self) -> int:
        return len(self.launched)

    @property
    def plans(self) -> list[Plan]:
        """The steps in flight, oldest first."""
        return [launched.plan for launched in self.launched]

    # -------------------------------------------------------- the ledger

    def launch(self, plan: Plan) -> None:
        """A step was launched: what it writes and samples is ahead of its turns."""
        shares = {
            turn: DECODE if len(w.tokens) == 1 and w.sample and not w.drafts else Ahead(len(w.tokens), w.sample + w.drafts, w.drafts > 0)
            for turn, w in zip(plan.turns, plan.works, strict=True)
        }  # (DECODE: nearly every work's share, one object for all of them)
        self.launched.append(_Launched(plan, shares))

    def land(self, plan: Plan) -> set[Turn] | frozenset[Turn]:
        """The step has run: it leaves the ledger (its turns are accounted by the
        caller). Returns the turns whose positions it wrote count for nothing,
        their K/V dropped since; none for a plan that was never launched. Steps
        land in the order they were launched."""
        if not self.launched or self.launched[0].plan is not plan:
            assert all(launched.plan is not plan for launched in self.launched), "steps land in the order launched"
            return NOTHING
        return self.launched.pop(0).void

    def discard(self, plan: Plan) -> None:
        """The step counts for nothing (abandoned): forget it, as if never launched."""
        for i, launched in enumerate(self.launched):
            if launched.plan is plan:
                del self.launched[i]
                return
        raise ValueError("discard: that step is not in flight")

    def forget_kv(self, turn: Turn) -> None:
        """The turn's K/V is dropped (its `computed` is 0): what steps in flight
        write for it is lost with it."""
        for launched in self.launched:
            share = launched.shares.get(turn)
            if share is not None:
                launched.shares[turn] = Ahead(0, share.tokens, share.verifying)
                launched.void = launched.void | {turn}

    # ----------------------------------------------- a turn, one step ahead

    def of(self, turn: Turn) -> Ahead:
        """The turn's share of the steps in flight (SETTLED if none): a sum over
        them, nearly always one step (two only between a launch and the landing
        of the step before it)."""
        flying = self.launched
        if len(flying) == 1:  # (nearly always, on an owner)
            return flying[0].shares.get(turn, SETTLED)
        if not flying:  # (always, in the simulator: it plans every step once the last has landed)
            return SETTLED
        share = SETTLED
        for launched in flying:
            add = launched.shares.get(turn)
            if add is not None:
                share = Ahead(share.positions + add.positions, share.tokens + add.tokens, share.verifying + add.verifying)
        return share

    def computed(self, turn: Turn) -> int:
        """Positions whose K/V is there once the steps in flight land."""
        return turn.computed + self.of(turn).positions

    def length(self, turn: Turn) -> int:
        """Its length once the steps in flight land, with the tokens they sample."""
        return turn.length + self.of(turn).tokens

    def pending(self, turn: Turn) -> int:
        """Tokens to feed before its next sample, once the steps in flight land:
        the unprefilled prompt, or 1."""
        return self.of(turn).pending(turn)

    def sampling(self, turn: Turn) -> int:
        """Tokens the steps in flight sample for it, not known yet."""
        return self.of(turn).tokens

    def writing(self, turn: Turn) -> int:
        """Positions of its K/V the steps in flight still write."""
        return self.of(turn).positions
