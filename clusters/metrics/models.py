"""GPU samples and their roll-ups (filled in by the metrics work)."""
