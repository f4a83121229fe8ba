"""The coding session's parts: the project's private copy, the sandbox its tests
run in, the test runners, patches and their verification, and the tools agents
call (plain async functions)."""
