"""What more than one caller does, written once: the API's routers, the workers' reconciler and
the CLI's server commands call these instead of repeating the sequence.

Services orchestrate catalog repositories (all SQL lives in `tierpoint.catalog`) and the Temporal
client (`tierpoint.temporal`); they hold no HTTP and no Temporal workflow code.
"""
