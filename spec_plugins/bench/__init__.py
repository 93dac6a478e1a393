"""Benchmarks and workload runners (scripts, not tests)."""
