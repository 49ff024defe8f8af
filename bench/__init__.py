"""Benchmarks for pgqueue-template: run them with `bench/run` (see docs/performance.md)."""
