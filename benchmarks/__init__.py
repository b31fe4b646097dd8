"""tierpoint's benchmarks: `python -m benchmarks` (see benchmarks/README.md)."""
