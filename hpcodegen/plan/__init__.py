"""Frozen-plan reading, classification and prediction (pure: no torch)."""
