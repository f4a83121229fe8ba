"""Ready-made coding agents, written against the public `swarm` API.

    pair        PairProgrammer   foreground: your messages, from the terminal or a script
    refactorer  Refactorer       background: one refactoring proposal per file
    tester      TestWriter       background: pytest tests per Python file
    docs        DocWriter        background: docstrings per file
    reviewer    Reviewer         background reviews; answers `Review` asks from others
                                 with a Verdict of typed findings (file, line, severity, message)

Background agents read a workspace folder and write proposals to
`<out>/<agent>/<file>.md`; they never touch the workspace's files.
"""

from agents.base import RecordingAgent, TurnRecord
from agents.pair import PairProgrammer
from agents.reviewer import Finding, Findings, Review, Reviewer, Verdict
from agents.workspace import DocWriter, Refactorer, TestWriter, WorkspaceAgent

BUILTIN = {
    "pair": PairProgrammer,
    "refactorer": Refactorer,
    "tester": TestWriter,
    "docs": DocWriter,
    "reviewer": Reviewer,
}

__all__ = [
    "BUILTIN",
    "DocWriter",
    "Finding",
    "Findings",
    "PairProgrammer",
    "RecordingAgent",
    "Refactorer",
    "Review",
    "Reviewer",
    "TestWriter",
    "TurnRecord",
    "Verdict",
    "WorkspaceAgent",
]
