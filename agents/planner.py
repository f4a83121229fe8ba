"""The planner: the foreground agent of a coding session.

It runs the tests, hands each failure to a fixer (round robin), sends every
verified patch to the patch reviewer and the test author, and keeps the score.
Meanwhile it answers the person: questions typed at the prompt (stdin a
terminal), or scripted ones (`--ask`, a session's script), about the project.
The prompt holds the project's code and the session's state, and the model may
call the project's tools (list, read and search files, run tests) for what the
prompt lacks (runtime.agent's `use_tools`) before it answers. The code stays in
the prompt because a small model does not look for itself: qwen2.5-coder-0.5b,
given the tools alone, called none and made up the project; made to call one,
it called them with placeholder arguments (`path/to/file.txt`). On an engine
that cannot hold a turn to tool calls (no tokenizer: the timing model), it
answers from the prompt alone. `status` is answered from the score alone,
without the model.

Its own run ends when every failure has a verified fix (or its fixer gave up)
and the notes on each are in, and the person is done: end of input or `quit` at
the prompt, or the last scripted question answered.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import anyio

from agents.coding import TEAM_SYSTEM, CodingAgent, Failure, FixRequest, FixResult, NewTests, ReviewNote, VerifiedPatch
from swarm import FOREGROUND, TurnFailed, UsageError, handler, tool
from swarm.coding.testing import TestReport

TOOL_READ_CHARS = 3000  # of a file the model reads with a tool: a small model's context is short
ASK_SYSTEM = (
    TEAM_SYSTEM + " A person asks you about the project and the session. Its code is below; use the tools for what is not "
    "(other files, a test run), then answer in a few sentences."
)


class Planner(CodingAgent):
    def __init__(
        self,
        name: str = "planner",
        priority: int = FOREGROUND,
        *,
        fixers: Sequence[str] = ("fixer-1",),
        reviewer: str | None = None,
        tester: str | None = None,
        script: Sequence[str] | None = None,
        interactive: bool = False,
        interval_s: float = 0.0,
        max_tokens: int = 160,
        tool_rounds: int = 2,
        say: Callable[[str], None] | None = None,
        prompt: Callable[[], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(name, priority, **kwargs)
        self.fixers = list(fixers)
        self.reviewer, self.tester = reviewer, tester
        self.script = list(script) if script is not None else None
        self.interactive = interactive
        self.interval_s = interval_s
        self.max_tokens = max_tokens
        self.tool_rounds = tool_rounds  # rounds of tool calls before the model must answer
        self.say = say or (lambda text: print(text, flush=True))
        self.prompt = prompt or (lambda: (sys.stdout.write("you> "), sys.stdout.flush()))
        self.baseline: TestReport | None = None
        self.failures: list[Failure] = []
        self.results: dict[str, FixResult] = {}  # failing test -> its fixer's result
        self.covered: dict[str, str] = {}  # failing test -> the test whose verified fix also fixes it
        self.reviews: dict[str, ReviewNote] = {}
        self.new_tests: dict[str, NewTests] = {}
        self.answers: list[tuple[str, str]] = []
        self._done = anyio.Event()

    async def run(self) -> None:
        self.baseline = await self.use("run_tests", self.tools.run_tests())
        self.say(f"{self.name}> tests before: {self.baseline.summary()}")
        self.failures = [Failure(t, self.baseline.messages.get(t, "")) for t in self.baseline.failing]
        # Every failure to a fixer, round robin; spare fixers double up on the first
        # ones. (No fixers: it only answers the person, as `swarm bench session` has it.)
        for i in range(max(len(self.failures), len(self.fixers)) if self.failures and self.fixers else 0):
            await self.tell(self.fixers[i % len(self.fixers)], FixRequest(self.failures[i % len(self.failures)]))
        self._check_done()
        if self.interactive:
            async with anyio.create_task_group() as group:
                group.start_soon(self._talk)
                await self._done.wait()  # set by the person's quit
                group.cancel_scope.cancel()
        else:
            await self._talk()  # the scripted questions, while the fixers work
            await self._done.wait()
        self.say(f"{self.name}> {self.status()}")

    async def _talk(self) -> None:
        async for question in self.questions():
            reply = await self.handle(question)
            self.answers.append((question, reply))
            self.say(f"{self.name}> {reply}")

    async def questions(self):
        if self.script is not None:
            for question in self.script:
                await anyio.sleep(self.interval_s)
                self.say(f"you> {question}")
                yield question
            return
        if not self.interactive:
            return
        while True:
            self.prompt()
            line = await anyio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
            if not line or line.strip().lower() in ("quit", "exit"):
                self._done.set()  # the person is done: the session ends with them
                return
            if line.strip():
                yield line.strip()

    async def handle(self, question: str) -> str:
        if question.strip().lower() == "status":
            return self.status()
        context = await self.project_context(4000, mentioned_in=question)
        asked = f"{context}\nState of the session: {self.status()}\n\nA person asks: {question}"
        if not self.can_constrain:
            return await self._answer_without_tools(asked)
        try:
            reply = await self.use_tools(
                [{"role": "system", "content": ASK_SYSTEM}, {"role": "user", "content": asked}],
                tools=[self.list_files, self.read_file, self.search, self.run_tests],
                max_rounds=self.tool_rounds,
                max_tokens=self.max_tokens,
            )
        except TurnFailed as exc:  # e.g. a prompt past the model's context: say so, and go on
            return f"(I could not answer that: {exc.reason})"
        return reply.strip()

    @tool(name="list_files")
    async def list_files(self) -> str:
        """List the project's files."""
        return "\n".join(await self.tools.list_files())

    @tool(name="read_file")
    async def read_file(self, path: str) -> str:
        """Read one file of the project (a path list_files gives)."""
        text = await self.tools.read_file(path)
        return text if len(text) <= TOOL_READ_CHARS else text[:TOOL_READ_CHARS] + "\n... (truncated)\n"

    @tool(name="search")
    async def search(self, pattern: str) -> str:
        """Lines of the project's files that match a regular expression, as path:line: text."""
        return "\n".join(await self.tools.search(pattern, limit=20)) or "(no line matches)"

    @tool(name="run_tests", timeout_s=300)
    async def run_tests(self, tests: list[str]) -> str:
        """Run the project's tests: the given test ids (path::name), or all of them for an empty list."""
        try:
            report = await self.tools.run_tests(tests)
        except UsageError as exc:
            return str(exc)
        failing = "".join(f"\n{t}: {report.messages.get(t, '')[-300:]}" for t in report.failing[:5])
        return report.summary() + failing

    async def _answer_without_tools(self, asked: str) -> str:
        try:
            reply = await self.answer(TEAM_SYSTEM, asked, max_tokens=self.max_tokens)
        except TurnFailed as exc:  # e.g. a prompt past the model's context: say so, and go on
            return f"(I could not answer that: {exc.reason})"
        return reply.strip()

    def status(self) -> str:
        if self.baseline is None:
            return "running the tests"
        if not self.failures:
            return f"tests: {self.baseline.summary()}; nothing to fix"
        fixed = [f.test for f in self.failures if f.test in self.covered]
        gave_up = [t for t, r in self.results.items() if not r.verified and t not in self.covered]
        working = len(self.failures) - len(fixed) - len(gave_up)
        return f"{len(self.failures)} failing test(s): {len(fixed)} fixed and verified, {working} being worked on, {len(gave_up)} not fixed"

    @handler
    async def fixed(self, msg: FixResult) -> None:
        known = self.results.get(msg.test)
        if known is not None and (known.verified or not msg.verified):
            return  # a second fixer on the same failure: the first verified fix stands
        self.results[msg.test] = msg
        if msg.verified:
            for test in msg.fixed or [msg.test]:
                self.covered.setdefault(test, msg.test)
            patch = VerifiedPatch(msg.test, msg.diff, self._message(msg.test))
            for helper in (self.reviewer, self.tester):
                if helper is not None:
                    await self.tell(helper, patch)
        self._check_done()

    @handler
    async def reviewed(self, msg: ReviewNote) -> None:
        self.reviews[msg.test] = msg
        self._check_done()

    @handler
    async def tests_written(self, msg: NewTests) -> None:
        self.new_tests[msg.test] = msg
        self._check_done()

    def _message(self, test: str) -> str:
        return next((f.message for f in self.failures if f.test == test), "")

    def _check_done(self) -> None:
        if self.baseline is None:
            return
        resolved = all(f.test in self.covered or f.test in self.results for f in self.failures)
        verified = [t for t, r in self.results.items() if r.verified]
        notes_in = all((self.reviewer is None or t in self.reviews) and (self.tester is None or t in self.new_tests) for t in verified)
        if resolved and notes_in and not self.interactive:
            self._done.set()
        if resolved and notes_in and self.interactive and not getattr(self, "_told", False):
            self._told = True
            self.say(f"\n{self.name}> every failure is resolved: {self.status()} (type more questions, or quit)")
