"""What drives Prefect for the CLI: process settings, the sized flow call, and its outcome.

Registered as the `prefect` launcher (entry-point group `qualify.launchers`, see qualify.launcher).
"""
