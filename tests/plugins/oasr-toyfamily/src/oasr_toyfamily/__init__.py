"""A toy OASR family from a third-party distribution: its own decode family and streaming encoder."""
