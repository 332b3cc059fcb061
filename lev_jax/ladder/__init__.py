"""Ladders and seeded studies of runs: collection, scaling fits, reports."""
