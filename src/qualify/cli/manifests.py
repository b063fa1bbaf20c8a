"""`qualify validate` and `qualify cases`: read manifests, show the matrix."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from qualify.manifest import is_reference_case
from qualify.manifest.cases import expand
from qualify.cli.common import JsonOption, load, out
from qualify.manifest.load import ManifestError, load_manifest
from qualify.workloads.secrets import redact_env


def validate(files: list[Path] = typer.Argument(..., help="manifest files")) -> None:
    """Check manifests; print a summary, or one line per problem (exit 2)."""
    problems, total = [], 0
    for path in files:
        try:
            loaded = load_manifest(path)
        except ManifestError as exc:
            problems.extend(exc.kept)
            total += exc.total
            continue
        manifest = loaded.release
        cases = expand(manifest)
        n_reference = sum(is_reference_case(c) for c in cases)
        own = [c for c in cases if not is_reference_case(c)]
        n_train = sum(c.kind == "train" for c in own)
        n_infer = sum(c.kind == "infer" for c in own)
        out.print(f"[green]ok[/green] {path}: {manifest.release.name} {manifest.release.tag} "
                  f"(candidate {manifest.release.candidate_tag}, previous {manifest.release.previous_tag or 'none'})")
        out.print(f"   {len(manifest.components)} components, {n_train} training cases, {n_infer} inference cases"
                  + (f", {len(own) - n_train - n_infer} other cases" if len(own) > n_train + n_infer else "")
                  + (f", {n_reference} against the reference image" if n_reference else ""))
        for spec in manifest.images:  # further images: each built, checked, run and promoted as itself
            view = manifest.for_image(spec.name)
            ran = sum(c.image == spec.name for c in own)
            out.print(f"   image {spec.name}: {view.release.repository}:{view.release.candidate_tag} "
                      f"({spec.build.builder}), {len(spec.components)} components, {ran} cases", markup=False,
                      highlight=False)
        targets = [(name, t) for name in manifest.image_names
                   for t in manifest.for_image(name).expanded_targets()]
        several = bool(manifest.images)
        out.print(f"   {len(targets)} promotion targets" + (" (all or none)" if several and targets else "")
                  + (":" if targets else ""))
        for name, target in targets:
            label = f"{name}/{target.name}" if several and name != manifest.release.name else target.name
            out.print(f"     {label}: {target.reference}", markup=False, highlight=False)
    if problems:  # every file's problems (capped as one list), then one exit
        raise ManifestError(problems, more=total - len(problems))


def cases(file: Path, as_json: bool = JsonOption) -> None:
    """List the test cases a manifest expands to (stable ids, same order every time)."""
    release = load(file).release
    expanded = expand(release)
    if as_json:
        # Secret-looking variables of a case's env are printed as "<redacted>" (CI logs keep this).
        docs = [{**c.to_dict(), "env": redact_env(c.to_dict().get("env") or {})} for c in expanded]
        print(json.dumps(docs, indent=2, sort_keys=True))
        return
    table = Table(title=f"{len(expanded)} cases of {file}")
    several = bool(release.images)  # a release of several images: the image each case runs in
    for col in ("case id", "kind") + ("image",) * several + ("resources", "parameters"):
        table.add_column(col, overflow="fold")
    for case in expanded:
        res = case.resources
        resources = f"cpu {res.cpus:g} gpu {res.gpus:g}" + (f" x{res.nodes} nodes" if res.nodes > 1 else "")
        if res.accelerator_type:
            resources += f" {res.accelerator_type}"
        params = ", ".join(f"{k}={v}" for k, v in case.to_dict()["params"].items()
                           if k not in ("deepspeed_config", "engine_args"))
        table.add_row(case.case_id, case.kind, *(case.image or release.release.name,) * several, resources, params)
    out.print(table)
