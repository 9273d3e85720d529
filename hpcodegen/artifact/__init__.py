"""Artifact layout, safe meta loading, hashing, signatures and atomic bundle writing (pure)."""
