"""The gate policy: thresholds, the regression rule's settings, variant gains, agreement, and waivers (one check or
one written-out family each)."""

from __future__ import annotations

import datetime as dt
import fnmatch
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from qualify import metrics as metric_info
from qualify.manifest.base import Name, Scheme, Strict, check_reference


WAIVER_MAX_MODEL_LEN = "max_model_len_limit"
# What a waiver may name (issue 24.3): one check, or one family of checks written out (`threshold:*`), never a
# pattern that covers more (`*`, `?`, `[...]` would turn every FAIL into WAIVED). The gate's WAIVABLE_PREFIXES
# are built from these.
WAIVABLE_CHECKS = ("regression", "variant_gain", "agreement")
WAIVABLE_FAMILIES = ("component", "threshold", "probe")
_PATTERN_CHARS = frozenset("*?[]")


def waiver_check_problem(check: str) -> str | None:
    """Why a waiver's `check` is refused, or None."""
    if check in WAIVABLE_CHECKS or check == WAIVER_MAX_MODEL_LEN:
        return None
    family, sep, name = check.partition(":")
    if sep and family in WAIVABLE_FAMILIES and (name == "*" or (
            name.strip() == name and name and not _PATTERN_CHARS & set(name))):
        return None
    return (f"{check!r} is not one check or one family of checks: name one of "
            f"{', '.join(WAIVABLE_CHECKS + (WAIVER_MAX_MODEL_LEN,))}, "
            f"{', '.join(f'{f}:<name>' for f in WAIVABLE_FAMILIES)}, or one family written out "
            f"({', '.join(f'{f}:*' for f in WAIVABLE_FAMILIES)}); a pattern (*, ?, [...]) that covers more "
            "checks is refused, and completeness cannot be waived")


# --------------------------------------------------------------------------- gate policy


class Threshold(Strict):
    cases: str = Field(default="*", description="glob over case ids")
    metric: str
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _bound(self) -> "Threshold":
        if self.min is None and self.max is None:
            raise ValueError("a threshold needs 'min' or 'max'")
        return self


class RegressionPolicy(Strict):
    # metrics compared per case kind (one name or a list); each in its own direction (qualify.metrics).
    metrics: dict[str, str | list[str]] = Field(default_factory=lambda: {
        "train": "tokens_per_s", "infer": "output_tokens_per_s", "sleep": "wall_s", "synthetic": "tokens_per_s"})
    # history: compare with the previous release's stored results, which must exist when previous_tag is
    # set (a missing or unusable baseline is INCOMPLETE); optional: the same, but a missing baseline is
    # only reported (a first release); paired: re-measure the previous image beside the candidate; duet: run the
    # previous image at the same time as the candidate, each on its own cores, step by step (execution.duet).
    baseline: Literal["history", "optional", "paired", "duet"] = "history"

    def metrics_for(self, kind: str) -> list[str]:
        named = self.metrics.get(kind) or []
        return [named] if isinstance(named, str) else list(named)
    # Defaults and why: qualify.metrics; the rule: qualify.gate.noninferiority (PASS = non-inferiority
    # shown, FAIL = a regression beyond max_regression shown, else more launches, then INCOMPLETE).
    max_regression: float = Field(default=metric_info.RECOMMENDED_MAX_REGRESSION, gt=0, lt=1)
    # One-sided error probability of each of a false PASS and a false FAIL, over all looks (confidence 1 - alpha).
    alpha: float = Field(default=metric_info.RECOMMENDED_ALPHA, gt=0, lt=0.5)
    # The first look: launches (pairs) before the first decision. Must not exceed the planned launches of a
    # kind that is compared (refused at validation, never a silent fallback).
    min_samples: int = Field(default=metric_info.RECOMMENDED_MIN_SAMPLES, ge=2, le=20)
    # The budget: an undecided comparison gets more launches (pairs) up to this many, then is INCOMPLETE.
    max_launches: int = Field(default=metric_info.RECOMMENDED_MAX_LAUNCHES, ge=2, le=20)
    # duet: each side's launch times at least this many steps (steps x repeats, rounded up to an even count),
    # whatever the case's own steps: the launch pair is the block, and a block of few steps is a noisy one
    # (execution.duet.with_duet_steps). Other modes ignore it.
    duet_steps: int = Field(default=metric_info.RECOMMENDED_DUET_STEPS, ge=2, le=10_000)
    enabled: bool = True

    @model_validator(mode="before")
    @classmethod
    def _gone(cls, value: Any) -> Any:
        if isinstance(value, dict) and "noise_floor" in value:
            raise ValueError("noise_floor is gone: a ratio against a noise floor is no longer a way to PASS "
                             "(the gate shows non-inferiority or takes more launches, up to max_launches); remove it")
        return value

    @model_validator(mode="after")
    def _budget(self) -> "RegressionPolicy":
        if self.max_launches < self.min_samples:
            raise ValueError(f"max_launches ({self.max_launches}) is below min_samples ({self.min_samples}): "
                             "the budget must allow the first look")
        return self


class VariantGain(Strict):
    variant: Name
    baseline: Name = "base"
    min_gain: float = Field(description="required relative gain, e.g. 0.2 for +20%, -0.1 tolerates -10%")
    metric: str = "tokens_per_s"
    enforce: bool = True


class Waiver(Strict):
    id: str
    cases: str = Field(default="*", description="glob over case ids")
    check: str = Field(description="probe:<name>, threshold:<metric>, regression, variant_gain, "
                                   "component:<name>, or max_model_len_limit")
    reason: str = Field(min_length=3)
    expires: dt.date

    @field_validator("check")
    @classmethod
    def _one_check(cls, value: str) -> str:
        problem = waiver_check_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    def covers_check(self, check: str) -> bool:
        """The check itself, or a member of the family written out as `family:*` (never a glob)."""
        if self.check.endswith(":*"):
            return check.startswith(self.check[:-1]) and len(check) > len(self.check) - 1
        return check == self.check

    def covers(self, case_id: str, check: str) -> bool:
        return fnmatch.fnmatchcase(case_id, self.cases) and self.covers_check(check)


REFERENCE_PREFIX = "reference/"  # a reference case's id: this prefix, then the case it re-measures


def is_reference_case(case: Any) -> bool:
    """A case that re-measures another against gate.reference (its id starts with `reference/`)."""
    return str(getattr(case, "case_id", case)).startswith(REFERENCE_PREFIX)


class ReferenceImage(Strict):
    """An image the candidate must beat, or stay within a tolerance of (the release note's "base vs. optimized"),
    that is not the previous release: each case its `cases` glob names runs again as `reference/<case id>`,
    the candidate beside this image, paired or in duet, and the gate's interval rule decides it against
    `min_gain` (a required gain: superiority shown) or `max_regression` (a tolerance: non-inferiority shown)."""

    image: str = Field(description="the reference image, by digest: registry/repository@sha256:<hex>")
    label: str | None = Field(default=None, max_length=200, description="what to call it in the report")
    python: str | None = Field(default=None, description="local executor: an interpreter whose package set has "
                                                         "exactly the image's digest (the local builder's digest)")
    mode: Literal["paired", "duet"] = "paired"
    cases: str = Field(default="*", description="glob over the case ids compared with the reference")
    # The release note compares the standard image as it comes with the optimized image with its optimizations on:
    # a training case's reference side runs this variant of the same model (e.g. `base`); default: the same case.
    variant: Name | None = None
    min_gain: float | None = Field(default=None, gt=-1, lt=10, description="required relative gain, e.g. 0.15 "
                                                                             "for +15% (superiority shown)")
    max_regression: float | None = Field(default=None, gt=0, lt=1, description="tolerated drop instead of a gain")

    @field_validator("image")
    @classmethod
    def _by_digest(cls, value: str) -> str:
        ref = check_reference(value)
        if not ref.digest:
            raise ValueError(f"{value!r} names no digest: a reference image is named by digest "
                             "(registry/repository@sha256:<hex>), never by a tag that can move")
        return value

    @model_validator(mode="after")
    def _one_rule(self) -> "ReferenceImage":
        if (self.min_gain is None) == (self.max_regression is None):
            raise ValueError("give exactly one of 'min_gain' (a required gain, e.g. 0.15) or 'max_regression' "
                             "(a tolerated drop, e.g. 0.05)")
        return self

    @property
    def required_change(self) -> float:
        """The change the candidate's worst end must reach: +min_gain, or -max_regression."""
        return self.min_gain if self.min_gain is not None else -float(self.max_regression or 0)

    @property
    def name(self) -> str:
        return self.label or self.image

    def covers(self, case_id: str) -> bool:
        return fnmatch.fnmatchcase(case_id, self.cases)


class GatePolicy(Strict):
    thresholds: list[Threshold] = Field(default_factory=list)
    regression: RegressionPolicy = Field(default_factory=RegressionPolicy)
    variant_gains: list[VariantGain] = Field(default_factory=list)
    agreement: dict[Scheme, float] = Field(default_factory=dict,
                                           description="minimum token agreement per scheme")
    # The most the token agreement may drop from the previous release's on the same positions (absolute):
    # the paired check shows a smaller drop to PASS (gate/agreement.py).
    agreement_max_drop: float = Field(default=0.01, ge=0, lt=1)
    probes_required: bool = True
    waivers: list[Waiver] = Field(default_factory=list)
    reference: ReferenceImage | None = None

    def regression_for(self, case: Any) -> RegressionPolicy:
        """The comparison rule a case is judged by: gate.regression, or for a reference case the same rule
        against the reference (its mode, and its required change as a signed margin: max_regression -0.15 is
        "a gain of 15% shown"; the interval rule is the same, gate/noninferiority)."""
        if self.reference is None or not is_reference_case(case):
            return self.regression
        return RegressionPolicy.model_construct(**{**dict(self.regression), "baseline": self.reference.mode,
                                                   "max_regression": -self.reference.required_change,
                                                   "enabled": True})

    @field_validator("agreement")
    @classmethod
    def _agreement_range(cls, value: dict[str, float]) -> dict[str, float]:
        for scheme, minimum in value.items():
            if not 0 <= minimum <= 1:
                raise ValueError(f"agreement for {scheme!r} must be in [0, 1], got {minimum}")
        return value
