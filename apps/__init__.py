"""The entry points: the `tierpoint` command (`cli`), the embedded dev stack (`devstack`) and the
workers' wiring (`worker`). The top floor: it wires `api/`, `activities/` and `workflows/` onto
the core in `tierpoint/`, and nothing below imports it (the import-linter contracts in
pyproject.toml say so)."""
