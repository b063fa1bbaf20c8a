"""Prefect tasks: thin wrappers of qualify's domain functions (names, retries, no caching)."""
