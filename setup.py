"""Maps the repository's top-level Prefect folders into the `qualify_prefect` package (pyproject.toml has
the rest): setuptools' pyproject table cannot combine package discovery with an explicit package list."""

from setuptools import find_packages, setup

PREFECT_FOLDERS = ("flows", "tasks", "driver")

setup(
    packages=find_packages("src", include=["qualify", "qualify.*", "qualify_prefect"])
    + [f"qualify_prefect.{name}" for name in PREFECT_FOLDERS],
    package_dir={"": "src", **{f"qualify_prefect.{name}": name for name in PREFECT_FOLDERS}},
)
