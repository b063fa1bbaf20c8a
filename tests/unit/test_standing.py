"""A digest's standing per release (issue 24.4): per release, the newest judged run's latest decision; another
release never clears it, and re-judging an older run never overrides a newer one of the same release."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from qualify.gate.standing import by_release


def _run(run_id: int, release_id: int) -> SimpleNamespace:
    return SimpleNamespace(id=run_id, release_id=release_id,
                           release=SimpleNamespace(name=f"r{release_id}", tag="1"))


def _decisions(*rows: tuple[int, int, str]) -> list[tuple[SimpleNamespace, SimpleNamespace]]:
    """(run id, release id, verdict) in decision order; decision ids 1, 2, ..."""
    return [(SimpleNamespace(id=k, run_id=run, verdict=verdict), _run(run, release))
            for k, (run, release, verdict) in enumerate(rows, start=1)]


def _verdicts(rows) -> dict[int, tuple[int, str]]:
    return {s.release_id: (s.run.id, s.decision.verdict) for s in by_release(rows)}


def test_another_release_never_clears_a_fail() -> None:
    # release 1 FAILs the digest, release 2 PASSes it later: release 1 still stands FAIL
    assert _verdicts(_decisions((1, 1, "FAIL"), (2, 2, "PASS"))) == {1: (1, "FAIL"), 2: (2, "PASS")}


def test_re_judging_an_older_run_never_overrides_the_newer_run() -> None:
    rows = _decisions((1, 1, "PASS"), (2, 1, "INCOMPLETE"), (1, 1, "PASS"), (1, 1, "PASS"))
    assert _verdicts(rows) == {1: (2, "INCOMPLETE")}


def test_the_newest_run_re_judged_is_its_latest_decision() -> None:
    assert _verdicts(_decisions((1, 1, "PASS"), (2, 1, "FAIL"), (2, 1, "PASS"))) == {1: (2, "PASS")}
    assert _verdicts(_decisions((1, 1, "FAIL"), (2, 1, "PASS"), (2, 1, "FAIL"))) == {1: (2, "FAIL")}


verdicts = st.sampled_from(["PASS", "FAIL", "INCOMPLETE"])


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(1, 6), verdicts), min_size=1, max_size=14))
def test_property_a_release_s_standing_ignores_other_releases_and_older_runs(rows) -> None:
    # runs 1-3 belong to release 1, runs 4-6 to release 2; decisions in the drawn order
    decisions = _decisions(*[(run, 1 if run <= 3 else 2, v) for run, v in rows])
    for release in (1, 2):
        mine = [(d, r) for d, r in decisions if r.release_id == release]
        if not mine:
            continue
        newest = max(r.id for _, r in mine)
        expected = [d.verdict for d, r in mine if r.id == newest][-1]
        # the answer for this release does not depend on what the other release decided, or in which order
        others = [(d, r) for d, r in decisions if r.release_id != release]
        for merged in (mine + others, others + mine):
            merged = sorted(merged, key=lambda dr: dr[0].id)
            assert _verdicts(merged)[release] == (newest, expected)


def test_every_release_is_one_standing() -> None:
    rows = _decisions(*[(run, run % 3, "PASS") for run in range(1, 10)])
    assert sorted(_verdicts(rows)) == [0, 1, 2]
    assert all(len(list(g)) == 1 for _, g in itertools.groupby(by_release(rows), key=lambda s: s.release_id))


def test_promotion_targets_are_parsed_once_per_manifest_text_and_never_shared_across_texts() -> None:
    """push_check._target_names: keyed by the sha256 of the stored text itself, so two runs with one manifest
    share a parse, and a run whose text differs never gets another's targets (whatever its stored sha256 says)."""
    from types import SimpleNamespace

    from qualify.gate import push_check

    def manifest(target: str) -> str:
        return (f"apiVersion: qualify/v1\nrelease: {{name: r, repository: 127.0.0.1:5000/q/r, tag: '1', candidate_tag: '1-rc1'}}\n"
                "custom_cases: [{name: s, kind: sleep, params: {duration_s: 0}}]\n"
                f"promotion:\n  targets:\n    - {{name: t, reference: '{target}:1'}}\n")

    a = SimpleNamespace(id=1, manifest_sha256="same", manifest_text=manifest("reg.example.com/team/a"))
    b = SimpleNamespace(id=2, manifest_sha256="same", manifest_text=manifest("reg.example.com/team/b"))
    c = SimpleNamespace(id=3, manifest_sha256="other", manifest_text=a.manifest_text)
    push_check._TARGETS.clear()
    assert push_check._target_names(a) == {"reg.example.com/team/a"}
    assert push_check._target_names(b) == {"reg.example.com/team/b"}  # the stored sha256 is not trusted
    assert push_check._target_names(c) == {"reg.example.com/team/a"}
    assert len(push_check._TARGETS) == 2
