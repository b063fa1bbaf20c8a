"""The README's configuration table names every variable the driver reads (qualify.settings.ENVIRONMENT)."""

from __future__ import annotations

import re
from pathlib import Path

from qualify.settings import CREDENTIAL_ENVIRONMENT, ENVIRONMENT, Settings

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_configuration_table_names_every_setting() -> None:
    text = README.read_text()
    table = text[text.index("## Configuration"):text.index("## The CLI")]
    named = set(re.findall(r"`(QUALIFY_[A-Z_]+)`", table))
    assert set(ENVIRONMENT) - named == set(), "add these to the README's configuration table"
    assert {"QUALIFY_REGISTRY_USERNAME", "QUALIFY_REGISTRY_PASSWORD"} <= named
    assert set(CREDENTIAL_ENVIRONMENT) >= {"QUALIFY_REGISTRY_USERNAME", "QUALIFY_REGISTRY_PASSWORD"}


def test_service_settings_parse_and_the_token_stays_hidden() -> None:
    settings = Settings.load(env={"QUALIFY_SERVICE_TOKEN": "s3cret", "QUALIFY_PROTECT": "127.0.0.1:5000/a/*:1.*,b/c",
                                  "QUALIFY_ENFORCE": "Revert", "QUALIFY_INSECURE_REGISTRIES": "127.0.0.1:5000, x:1"})
    assert settings.protect == (("127.0.0.1:5000/a/*", "1.*"), ("b/c", "*"))
    assert settings.enforce == "revert" and settings.insecure_registries == ("127.0.0.1:5000", "x:1")
    assert "s3cret" not in repr(settings) and settings.service_token == "s3cret"
