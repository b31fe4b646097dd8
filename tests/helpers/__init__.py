"""What tests share, in one place: helper functions and classes (services.py, lifecycle.py,
api.py, retention.py, storage.py, client.py, planner_builders.py, planner_invariants.py,
cost_model.py) and the API fixtures (api_fixtures.py). Fixtures live in conftest.py files; test
modules import helpers from here, never from another package's conftest."""
