"""The `tierpoint` command line: services (dev, api, worker, migrate) and operator/training-side
commands against the REST API (status, checkpoints, restore, demo)."""
