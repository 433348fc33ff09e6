"""A tiny CTC architecture distributed as a third-party OASR plugin."""
