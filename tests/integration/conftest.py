"""Integration tests run the real pieces (Ray, Prefect, PostgreSQL, the registry, containers, workloads)."""

from __future__ import annotations

