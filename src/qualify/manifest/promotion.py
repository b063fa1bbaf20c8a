"""Promotion targets, plain-HTTP registries (an opt-in with a reason when not loopback), and their expansion."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from qualify.manifest.base import Name, Strict, check_reference, no_duplicates
from qualify.manifest.build import Reason


# --------------------------------------------------------------------------- promotion


class PromotionTarget(Strict):
    name: Name
    reference: str | None = None
    template: str | None = Field(default=None, description="e.g. acs-registry-vpc.{region-id}.cr.aliyuncs.com/egslingjun/{image:tag}")
    regions: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_of(self) -> "PromotionTarget":
        if bool(self.reference) == bool(self.template):
            raise ValueError("give exactly one of 'reference' or 'template'")
        if self.template and "{region-id}" in self.template and not self.regions:
            raise ValueError("a template with {region-id} needs 'regions'")
        return self

    @field_validator("reference")
    @classmethod
    def _reference(cls, value: str | None) -> str | None:
        if value is not None:
            ref = check_reference(value)
            if ref.digest or not ref.tag:
                raise ValueError(f"{value!r}: a promotion target must end in a tag (not a digest)")
        return value


class InsecureRegistryOptIn(Strict):
    """Plain HTTP to a registry that is not on loopback, and why."""

    registry: str = Field(description="host[:port] as listed in insecure_registries")
    reason: Reason


class PromotionSpec(Strict):
    on_pass: bool = Field(default=False, description="promote automatically at the end of a PASS run")
    targets: list[PromotionTarget] = Field(default_factory=list)
    # Declared before insecure_registries, which checks against it.
    opt_ins: list[InsecureRegistryOptIn] = Field(default_factory=list)
    # Plain HTTP (no TLS): loopback registries freely; any other only with an opt-in above.
    insecure_registries: list[str] = Field(default_factory=list,
                                           description="registries reached over plain HTTP (loopback tests)")

    @field_validator("insecure_registries")
    @classmethod
    def _insecure_needs_opt_in(cls, value: list[str], info: ValidationInfo) -> list[str]:
        if not value:
            return value
        from qualify.registry.transport import is_loopback  # httpx and rich only when needed

        granted = {o.registry.strip().rstrip("/") for o in info.data.get("opt_ins") or []}
        for i, registry in enumerate(value):
            name = registry.strip().rstrip("/")
            if not name or "/" in name or any(c.isspace() for c in name):
                raise ValueError(f"[{i}]: {registry!r} is not a host[:port]")
            if not is_loopback(name) and name not in granted:
                raise ValueError(f"[{i}]: {registry!r} is not on loopback: plain HTTP (TLS off, credentials "
                                 f"in the clear) needs the opt-in promotion.opt_ins: "
                                 f"[{{registry: {name}, reason: ...}}] (the report shows it)")
        return value

    @model_validator(mode="after")
    def _unique(self) -> "PromotionSpec":
        no_duplicates([t.name for t in self.targets], "targets")
        listed = {r.strip().rstrip("/") for r in self.insecure_registries}
        for i, opt in enumerate(self.opt_ins):
            if opt.registry.strip().rstrip("/") not in listed:
                raise ValueError(f"opt_ins[{i}]: {opt.registry!r} is not in insecure_registries: remove it")
        return self

    def opt_in_notes(self) -> list[str]:
        return [f"promotion: plain HTTP to {o.registry} ({o.reason})" for o in self.opt_ins]


class ExpandedTarget(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    reference: str
