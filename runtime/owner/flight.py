"""The step in flight: a step launched on the device and not yet landed.

The GPU owner plans step N+1 while step N runs, as vLLM's async scheduling and
SGLang's overlap scheduler do, so the device waits for no host work but the
hand-over of N's tokens. Everything that overlap needs about one step is here,
in one object:

- the plan, entered in the scheduler's steps in flight as launched
  (`Scheduler.advance`, runtime.scheduling.inflight) so the next step can be
  planned on it;
- the device job that runs it in the owner's step thread;
- the abandon flag it was launched with (runtime.owner.abandon), None if it runs to
  its end;
- the token hand-over: the step it was planned on (`ahead`) and what that step
  sampled, put into this step's decodes in the step thread right before it
  starts.

If it is abandoned there is nothing to undo: no turn changed when it was
launched, and the scheduler simply forgets it (`Scheduler.discard`).

The owner keeps the newest one; the one before it is landed right after the
newest is launched.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import msgspec

from runtime.scheduling.turns import Plan
from runtime.scheduling.work import Work

if TYPE_CHECKING:
    from runtime.owner.stepthread import Job

# What a step hands back from the step thread: a token (or None) per work (None
# for all: it was abandoned, runtime.owner.abandon), the turns it alone failed with
# why, and its time (None if it failed).
Ran = tuple[list[int | list[int] | None] | None, dict[int, str], float | None]


class StepInFlight:
    __slots__ = ("plan", "flag", "chained", "job", "_ahead", "sampled", "drafted", "complete")

    def __init__(self, plan: Plan, ahead: StepInFlight | None, flag: threading.Event | None, *, chained: bool) -> None:
        self.plan = plan
        self.flag = flag
        self.chained = chained  # launched while the step before ran: the device idles only for the hand-over
        self.job: Job[Ran] | None = None  # set once handed to the step thread
        # The hand-over, touched only in the step thread: the step this one was
        # planned on (its tokens feed this one's decodes), and what this one sampled.
        self._ahead = ahead
        self.sampled: dict[int, int | list[int] | None] = {}
        self.drafted: dict[int, list[int]] = {}  # the drafts a draft model wrote, by turn (runtime.owner.drafter)
        # Whether it ran every work with no fault, so every decode planned on it
        # finds its token in `sampled`.
        self.complete = False

    @property
    def abandoned(self) -> bool:
        return self.flag is not None and self.flag.is_set()

    def hand_over(self) -> list[Work]:
        """In the step thread, right before the step starts: the works to run,
        its decodes planned on a token the step before had not sampled yet
        (`Work.follows`) given that token, as SGLang resolves its future tokens on the
        device side. The plan's own works are left as planned (copies carry the
        tokens), so nothing the scheduler holds changes under it. A decode whose
        token never came (its turn faulted) is left out of what runs; otherwise
        the list matches the plan's, item for item."""
        ahead, self._ahead = self._ahead, None  # (so a long run of steps does not chain them all)
        works = self.plan.works
        if ahead is None:
            return works
        sampled, replace = ahead.sampled, msgspec.structs.replace
        if ahead.complete:  # (nearly always: every decode planned on it has its token)
            try:
                return [replace(w, tokens=[*w.tokens[:-1], sampled[w.turn]], follows=False) if w.follows else w for w in works]
            except KeyError:
                pass  # (one planned on a turn it did not run: left out below)
        runnable = []
        for work in works:
            if work.follows:
                token = sampled.get(work.turn)
                if token is None:
                    continue
                work = replace(work, tokens=[*work.tokens[:-1], token], follows=False)
            runnable.append(work)
        return runnable
