"""The release's further images (`images:`): a serving image beside the training image, say. The release's own
image (release.repository, build, components, promotion.targets) is the first and the default; each entry here
is built, verified, run and promoted the same way, by the same code, through `ReleaseManifest.for_image`."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from qualify.imageref import TAG_PATTERN
from qualify.manifest.base import Name, Strict, repository_only
from qualify.manifest.build import BuildSpec
from qualify.manifest.matrix import Component
from qualify.manifest.promotion import PromotionTarget


class ImageSpec(Strict):
    name: Name = Field(description="what cases call it in their `image:` field, e.g. serving")
    repository: str = Field(description="the image's repository (without tag or digest)")
    # Absent: the release's. (Its previous is the previous release's run of this image, found through the
    # release: release.previous_tag.)
    candidate_tag: str | None = None
    description: str = ""
    build: BuildSpec
    components: list[Component] = Field(default_factory=list)
    # Where a PASS promotes this image (the release's own targets are promotion.targets; all or none).
    targets: list[PromotionTarget] = Field(default_factory=list)

    @field_validator("repository")
    @classmethod
    def _repository(cls, value: str) -> str:
        return repository_only(value)

    @field_validator("candidate_tag")
    @classmethod
    def _tag(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(TAG_PATTERN, value):
            raise ValueError(f"{value!r} is not a valid image tag")
        return value
