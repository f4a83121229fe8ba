"""The benchmarks behind `swarm bench`: engine, owner, swarm, cluster, serve, watch,
load, quants, constrained decoding and fixing."""
