"""The fixer: samples candidate patches for one failing test, in parallel, and
keeps the one the tests verify.

Each round asks the model `candidates` times at `temperature` with one prompt
(the project's code first, shared by every fixer and candidate: the prefix
cache computes it once), each answer held to one fenced Python block (the
corrected function, nothing else: swarm.coding.patches.PYTHON_BLOCK), turns it
into a patch (swarm.coding.patches) and runs the tests on it, each on its own scratch copy. A candidate is judged by:
the failing test passes, no passing test breaks, the smallest diff. When none is
verified, the best one and what its tests said go into the next round's prompt.
"""

from __future__ import annotations

import time
import zlib
from typing import Any

import anyio

from agents.coding import TEAM_SYSTEM, CodingAgent, Failure, FixRequest, FixResult
from runtime.scheduling.work import GREEDY, Sampling
from swarm import BACKGROUND, TurnCancelled, TurnFailed, handler
from swarm.coding.patches import PYTHON_BLOCK, Judgement, code_block, code_proposal, read_proposal


class Fixer(CodingAgent):
    def __init__(
        self,
        name: str,
        priority: int = BACKGROUND,
        *,
        planner: str = "planner",
        candidates: int = 4,
        temperature: float = 0.8,
        rounds: int | None = None,
        max_tokens: int = 320,
        **kwargs: Any,
    ) -> None:
        super().__init__(name, priority, **kwargs)
        self.planner = planner
        self.candidates = candidates
        self.sampling = Sampling(temperature=temperature, top_p=0.95) if temperature > 0 else GREEDY
        self.rounds = rounds  # None: until the swarm stops
        self.max_tokens = max_tokens

    @handler
    async def fix(self, msg: FixRequest) -> None:
        await self.tell(self.planner, await self.solve(msg.failure))

    async def solve(self, failure: Failure, targets: list[str] | None = None) -> FixResult:
        """Rounds of candidates until one makes `targets` (default: the failing
        test) pass with nothing broken, or `rounds` run out."""
        targets = targets or [failure.test]
        started = time.monotonic()
        files = await self.source_files()
        context = await self.project_context(mentioned_in=failure.message)
        test_code = await self.test_source(failure.test)
        seen: dict[str, Judgement] = {}  # a diff tested once is not tested again
        tried = tokens = round_ = 0
        feedback = ""
        best: Judgement | None = None
        while self.rounds is None or round_ < self.rounds:
            round_ += 1
            prompt = self.request(context, failure, test_code, feedback)
            judged: list[Judgement] = []

            # The group below finishes within this round: the defaults only say
            # which round's values a candidate uses.
            async def candidate(i: int, round_: int = round_, prompt: str = prompt, judged: list[Judgement] = judged) -> None:
                nonlocal tried, tokens
                sampling = (
                    self.sampling
                    if self.sampling.greedy
                    else Sampling(
                        temperature=self.sampling.temperature,
                        top_p=self.sampling.top_p,
                        seed=zlib.crc32(f"{self.name} {failure.test} {round_} {i}".encode()),
                    )
                )
                try:
                    answer = await self.answer(TEAM_SYSTEM, prompt, max_tokens=self.max_tokens, sampling=sampling, regex=PYTHON_BLOCK)
                except TurnFailed:
                    return
                tried += 1
                tokens += self.records[-1].tokens if self.records else 0
                code = code_block(answer)
                # (free text where the engine cannot constrain, or a block cut off at max_tokens)
                proposal = code_proposal(code, files) if code is not None else read_proposal(answer, files)
                if proposal is None:
                    return
                if proposal.diff not in seen:
                    seen[proposal.diff] = await self.use("propose_patch", self.tools.propose_patch(proposal.diff, targets))
                judged.append(seen[proposal.diff])

            try:
                async with anyio.create_task_group() as group:
                    for i in range(self.candidates):
                        group.start_soon(candidate, i)
            except TurnCancelled:
                break  # the swarm is stopping
            if tried == 0:  # not one turn ran (a prompt past the model's context, say): more rounds would not either
                return FixResult(
                    test=failure.test,
                    fixer=self.name,
                    verified=False,
                    rounds=round_,
                    seconds=time.monotonic() - started,
                    note="the model could not take the prompt",
                )
            judged.sort(key=Judgement.rank)
            if judged and (best is None or judged[0].rank() < best.rank()):
                best = judged[0]
            if best is not None and best.verified:
                baseline = self.tools.baseline
                also = [t for t in (baseline.failing if baseline else []) if best.report and best.report.outcomes.get(t) == "passed"]
                return FixResult(
                    test=failure.test,
                    fixer=self.name,
                    verified=True,
                    diff=best.diff,
                    fixed=also or best.fixed,
                    candidates=tried,
                    rounds=round_,
                    tokens=tokens,
                    seconds=time.monotonic() - started,
                )
            feedback = self.feedback(best)
        return FixResult(
            test=failure.test,
            fixer=self.name,
            verified=False,
            candidates=tried,
            rounds=round_,
            tokens=tokens,
            seconds=time.monotonic() - started,
            note=best.feedback() if best else "no answer held a patch",
        )

    def request(self, context: str, failure: Failure, test_code: str, feedback: str) -> str:
        """The project first (shared), then this failure, then what the last round taught."""
        test = f"```python\n{test_code}\n```\n" if test_code else ""
        return (
            f"{context}\nThe test {failure.test} fails.\n{test}Error:\n```\n{failure.message[-900:]}\n```\n{feedback}"
            "Fix the bug in the project's code, not in the test. "
            "Reply with the corrected function (or functions), complete, in one ```python block."
        )

    @staticmethod
    def feedback(best: Judgement | None) -> str:
        if best is None:
            return "An earlier answer held no code block with a function of the project: reply with one.\n"
        changed = "\n".join(line for line in best.diff.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---")))
        return f"An earlier attempt changed:\n```diff\n{changed[:800]}\n```\nand did not work: {best.feedback()[:700]}\n"
