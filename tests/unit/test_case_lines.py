"""What a case's task run logs about its result (qualify.report.case_lines): key figures with each launch's."""

from __future__ import annotations

from qualify.report.case_lines import figure_lines, resources_text


def test_each_key_figure_with_its_launches() -> None:
    lines = figure_lines("train/tiny/base", "train", {"tokens_per_s": 1234.5, "mfu": None, "other": 3},
                         {"per_launch.tokens_per_s": [1201.0, 1234.5, 1270.25]})
    assert lines == ["train/tiny/base: tokens_per_s=1234 (launches 1201, 1234, 1270)", "train/tiny/base: mfu=n/a"]
    assert figure_lines("sleep/nap", "sleep", {"wall_s": 0.2}, {"per_launch.wall_s": [0.2]}) == ["sleep/nap: wall_s=0.2"]
    assert figure_lines("infer/x", "infer", None, None) == []


def test_resources_are_named_even_when_defaulted() -> None:
    assert resources_text({"gpus": 1, "cpus": 4}) == "gpus=1, cpus=4"
    assert resources_text({}) == "default resources (1 CPU)"
