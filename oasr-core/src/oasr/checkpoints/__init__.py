"""Checkpoint conversion and OASR's native bundle format."""
