"""Scheduling: the deterministic scheduler and its parts (priorities, batching, KV
memory, accounting), turns and their blocks, the prefix cache, the step cost law,
and the Work an engine runs."""
