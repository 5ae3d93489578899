"""Development tools (fuzzing, benchmarks, synthetic dumps): never imported by a replay."""
