"""What tests share, in one place: helper functions and classes (services, lifecycle, api,
retention, storage, client, faults, worker_process, consistency, planner_builders,
planner_invariants, cost_model, kustomize, manifest_rules, s3_proxy, which benchmarks use too)
and the API fixtures (api_fixtures). Fixtures live in conftest.py files; test modules import
helpers from here, never from another package's conftest."""
