"""A job's timeline: its branches (rollbacks), forks from other jobs, the lineage of its
checkpoints and their health verdicts (docs/timeline.md)."""
