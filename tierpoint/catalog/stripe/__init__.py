"""A coded peer tier's stripes: their state machine (machine) and what they make restorable
(coverage)."""
