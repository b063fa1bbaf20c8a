"""The Prefect side of qualify, installed under the project's own name.

The repository keeps `flows/`, `tasks/` and `driver/` at its top level; pyproject.toml maps them to
`qualify_prefect.flows`, `qualify_prefect.tasks` and `qualify_prefect.driver`, so that a wheel installs
nothing called `flows`, `tasks` or `driver` into site-packages (names other projects use too).
The library (`qualify`) never imports this package.
"""
