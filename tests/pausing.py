"""An agent that keeps what it is told of its turns' pauses and resumes: the
preemption tests on one owner and across a cluster share it."""

from __future__ import annotations

from swarm import BACKGROUND, Agent, PauseInfo, ResumeInfo


class Pausable(Agent):
    def __init__(self, name: str, priority: int = BACKGROUND) -> None:
        super().__init__(name, priority)
        self.pauses: list[PauseInfo] = []
        self.resumes: list[ResumeInfo] = []

    async def on_pause(self, info: PauseInfo) -> None:
        self.pauses.append(info)

    async def on_resume(self, info: ResumeInfo) -> None:
        self.resumes.append(info)
