"""Environments, templates and workspace state (filled in by the workspaces work)."""
