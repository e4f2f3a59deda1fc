"""Placeholder package; see docs/design.md."""
