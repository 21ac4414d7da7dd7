"""docs/benchmarks.md's current numbers are what the committed results files say (issue 30)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks import command
from benchmarks.suite import summary

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"


def test_the_page_holds_what_the_results_files_give() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert page.count(summary.BEGIN) == 1 and page.count(summary.END) == 1
    generated = page[page.index(summary.BEGIN) : page.index(summary.END) + len(summary.END)]
    assert generated == summary.render(RESULTS), "run: python -m benchmarks report"


def test_every_miss_has_its_cause_and_every_area_its_file() -> None:
    for area in summary.AREAS:
        data = json.loads((RESULTS / area.file).read_text(encoding="utf-8"))
        for row in summary.rows(data):
            if row.passed is False:
                assert summary.cause(row) != summary.NO_CAUSE, row.what
    assert summary.NO_CAUSE not in summary.render(RESULTS)


def test_the_check_fails_on_a_changed_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for area in summary.AREAS:
        (tmp_path / area.file).write_bytes((RESULTS / area.file).read_bytes())
    chosen, options = command.parse(["report", "--check", "--out", str(tmp_path)])
    assert [b.name for b in chosen] == ["report"]
    summary.run(options)  # the committed files: the page matches
    assert "matches" in capsys.readouterr().out
    data = json.loads((tmp_path / "writes.json").read_text(encoding="utf-8"))
    data["targets"][0]["measured"] = "9.99x"
    (tmp_path / "writes.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(SystemExit) as exited:
        summary.run(argparse.Namespace(out=tmp_path, check=True))
    assert exited.value.code == 1
    assert "python -m benchmarks report" in capsys.readouterr().err


def test_a_miss_without_a_cause_is_named() -> None:
    row = summary.Row("a target nobody explained >= 2x", "1.0x", False, "")
    assert summary.cause(row) == summary.NO_CAUSE
    assert summary.cause(summary.Row("x", "1", False, "its own reason")) == "its own reason"
