"""Helpers shared by the tests (never named test_*: pytest would collect them)."""
