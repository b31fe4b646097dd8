"""The Temporal contract: every workflow and activity name, what each takes and returns, the task
queues, and the timeouts and retry policies the workflows schedule activities with.

The one thing `workflows/` imports (besides temporalio), and what `activities/`, the workers and
whoever starts a workflow agree on. Pure data: no I/O, nothing that could make a workflow
non-deterministic. Payloads are small by design (ids and ordinal ranges, never shard lists or
bytes); field names are part of recorded histories, so renaming a field breaks replay.
"""
