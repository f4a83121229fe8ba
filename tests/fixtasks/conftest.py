"""The fix tasks of `swarm bench fix` (swarm/bench/fix.py): each folder here is a tiny
project with failing tests on purpose, a benchmark for the coding team, not a
test of slotswarm. The suite leaves them alone."""

collect_ignore_glob = ["*"]
