"""How hard the property tests search. A test that asks for more (or fewer) examples than
Hypothesis' default says how many with `examples(n)`: n under the default profile, and the same
share of n under another profile as that profile's max_examples is of the default's. So
`--hypothesis-profile fast` (the fast tier's, `python3 bootstrap.py test --fast`) runs every
property a fifth as long, and the full suite runs each one as hard as it asks."""

from __future__ import annotations

from hypothesis import settings

FAST = "fast"
# No deadline per example: the machines are shared, and an example that takes 300 ms under a
# load of 30 is no bug (Hypothesis then reports the test as flaky and fails it).
settings.register_profile("tierpoint", deadline=None)
settings.load_profile("tierpoint")
# A fifth of the examples: Hypothesis finds most failures in its first few dozen, and the full
# suite goes on to the count each test asks for.
settings.register_profile(FAST, parent=settings.get_profile("tierpoint"), max_examples=20)


def examples(full: int) -> int:
    """`full` examples under the default profile, scaled to the loaded one (at least one)."""
    loaded = settings.default
    assert loaded is not None  # the hypothesis plugin loads a profile before tests import
    return max(1, full * loaded.max_examples // settings.get_profile("default").max_examples)
