"""The HTML report (`qualify report`): what needs attention first, the tables and charts, self-contained;
and, in a real headless Chromium, what a person sees."""

from __future__ import annotations

import base64
import os
import re
import shutil
from pathlib import Path

import pytest
from support.reports import seed_release_line

from qualify.report.html import render, write_report
from qualify.report.views import report_view


def invoke(*args: str):
    from typer.testing import CliRunner

    from qualify.cli import app

    return CliRunner().invoke(app, list(args))


def _view(sessions, run_id: int):
    with sessions() as session:
        return report_view(session, run_id)


def test_report_view_compares_with_the_baseline_the_gate_used(sessions) -> None:
    line = seed_release_line(sessions)
    view = _view(sessions, line.run_b)
    assert view["decisions"][-1]["verdict"] == "FAIL"
    baseline = view["baseline"]
    assert baseline["a"]["run_id"] == line.run_a and baseline["b"]["run_id"] == line.run_b
    calls = {(r["case_id"], r["metric"]): r for r in baseline["rows"]}
    slow = calls[("train/tiny/base", "tokens_per_s")]
    assert slow["call"] == "regression" and slow["gate_status"] == "FAIL"
    assert slow["ratio_low"] <= slow["ratio"] <= slow["ratio_high"] and 0.8 < slow["ratio"] < 0.9
    assert calls[("infer/tq/none", "output_tokens_per_s")]["call"] == "improvement"
    assert calls[("train/tiny/compile", "tokens_per_s")]["call"] == "noise"
    assert view["policy"]["waivers"][0]["id"] == "KI-prefix-cache"
    # A first release has no baseline: the report says why instead of a comparison.
    first = _view(sessions, line.run_a)
    assert first["baseline"] is None and "no previous release" in first["baseline_note"]


def test_html_leads_with_failures_folds_passes_and_embeds_every_chart(sessions, tmp_path: Path) -> None:
    line = seed_release_line(sessions)
    page = render(_view(sessions, line.run_b))
    # the verdict first, then the failed checks, the waived ones, and only then the (folded) passes
    assert page.index(f"run {line.run_b}: FAIL</h1>") < page.index("Failed checks (1)") \
        < page.index("Waived failures (1)") < page.index("passed checks</summary>")
    failed_table = page[page.index("Failed checks"):page.index("Waived failures")]
    assert "train/tiny/base" in failed_table and "regression" in failed_table
    assert re.search(r"<details><summary>\d+ passed checks</summary>", page)
    for section in ("Components", "Training", "Comparison with the baseline", "Inference", "Probes", "Waivers",
                    "Retries", "Cases", "Environment"):
        assert f"<h2>{section}" in page, section
    assert "KI-prefix-cache" in page and "in force" in page  # the waiver with its expiry
    assert "outputs differ with the cache" in page  # the probe's detail
    assert "<td>train/tiny/compile</td><td>2</td>" in page  # the retried case
    images = re.findall(r"src='data:image/png;base64,([^']+)'", page)
    assert len(images) == 3  # training (one model), the baseline comparison, inference (one model)
    assert all(base64.b64decode(png).startswith(b"\x89PNG") for png in images)
    assert "http://" not in page and "https://" not in page  # self-contained: nothing fetched
    path = write_report(_view(sessions, line.run_b), tmp_path)
    assert path.name == f"run-{line.run_b}.html" and not list(tmp_path.glob("*.tmp"))


def test_report_command(db_url: str, sessions, tmp_path: Path) -> None:
    line = seed_release_line(sessions)
    done = invoke("report", str(line.run_b), "--db", db_url, "--out", str(tmp_path / "out"))
    assert done.exit_code == 0, done.output
    path = tmp_path / "out" / f"run-{line.run_b}.html"
    assert path.exists() and str(path.resolve()) in done.stdout and "FAIL" in done.stdout
    missing = invoke("report", "999", "--db", db_url, "--out", str(tmp_path))
    assert missing.exit_code == 2 and "no run 999" in missing.output


@pytest.mark.slow
def test_report_as_a_person_sees_it_in_chromium(sessions, tmp_path: Path) -> None:
    """Headless Chromium opens the file: the verdict banner, the failed check and every chart are visible,
    the passed checks are folded away; a full-page screenshot is kept for a person to look at."""
    from support.browser import Browser

    line = seed_release_line(sessions)
    path = write_report(_view(sessions, line.run_b), tmp_path)
    with Browser(tmp_path) as browser:
        browser.goto(path.resolve().as_uri())
        banner = browser.evaluate("document.querySelector('header.banner').innerText")
        assert "FAIL" in banner and "demo:1.1" in banner
        colour = browser.evaluate("getComputedStyle(document.querySelector('header.banner')).backgroundColor")
        assert colour == "rgb(207, 34, 46)"  # red
        failed = browser.evaluate(
            "Array.from(document.querySelectorAll('#gate tr.bad')).filter(r => r.checkVisibility())"
            ".map(r => r.innerText)")
        assert len(failed) == 1 and "train/tiny/base" in failed[0] and "regression" in failed[0]
        folded = browser.evaluate("document.querySelector('#gate details').open")
        assert folded is False
        hidden = browser.evaluate("Array.from(document.querySelectorAll('#gate details tr'))"
                                  ".filter(r => r.checkVisibility()).length")
        assert hidden == 0
        images = browser.evaluate("Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth, "
                                  "i.naturalHeight, i.checkVisibility()])")
        assert [i[0] for i in images] == ["training chart tiny", "baseline comparison chart", "inference chart tq"]
        assert all(done and w > 400 and h > 100 and visible for _, done, w, h, visible in images), images
        # The failures are on the first screen, before any scrolling.
        top = browser.evaluate("document.querySelector('#gate tr.bad').getBoundingClientRect().top")
        assert top < 900
        shot = browser.screenshot(tmp_path / "report.png")
    assert shot.stat().st_size > 50_000
    if os.environ.get("QUALIFY_TEST_SCREENSHOTS"):  # where a person wants to look at it
        keep = Path(os.environ["QUALIFY_TEST_SCREENSHOTS"])
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, keep / "report.png")
