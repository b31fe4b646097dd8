"""Tier storage backends: POSIX directories (local and shared tiers) and S3."""
