"""What the command line prints about itself: the command list, flags, paths, order (issue 30)."""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest
import zarr

from daskzarr_batches.tools.bench import BenchSettings, run_bench
from daskzarr_batches.tools.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]


def _commands() -> list[str]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return list(sub.choices or ())


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A relative path ``x.zarr`` (the working directory is ``tmp_path``) of 1000 x 2 float32."""
    monkeypatch.chdir(tmp_path)
    root = zarr.open_group("x.zarr", mode="w")
    root.create_array("f", data=np.arange(1, 2001, dtype="f4").reshape(1000, 2), chunks=(100, 2))
    return "x.zarr"


def test_cli_md_lists_every_command_once() -> None:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    commands = _commands()
    assert sorted(commands) == ["bench", "demo", "info", "shuffle"]
    rows = re.findall(r"^\| `(\w+)[ `]", text.split("## Commands", 1)[1], re.M)
    assert sorted(rows) == sorted(commands), rows  # each once
    words = {2: "two", 3: "three", 4: "four", 5: "five"}
    assert f"has {words[len(commands)]} commands" in text
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    described = readme.split("## Command line", 1)[1].split("\n## ", 1)[0]
    assert all(f"`{command}" in described for command in commands)


def test_cli_md_synopsis_names_every_option_of_its_command() -> None:
    """Each row of cli.md's command table names every long option its parser takes."""
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8").split("## Commands", 1)[1]
    (sub,) = (a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    missing = {}
    for command, parser in (sub.choices or {}).items():
        (row,) = re.findall(rf"^\| `{command}[ `](.*?)` \|", text, re.M)
        options = {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
        left = sorted(o for o in options - {"--help"} if not re.search(rf"{o}\b", row))
        if left:
            missing[command] = left
    assert missing == {}, f"docs/cli.md's synopsis leaves out {missing}"


class _Bar:
    """A live progress bar that notes what ``out`` held when the epoch's first batch came."""

    disable = False

    def __init__(self, out: io.StringIO, seen: list[str]) -> None:
        self.out, self.seen, self.updates = out, seen, 0

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, n: int) -> None:
        if self.updates == 0:
            self.seen.append(self.out.getvalue())
        self.updates += 1

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        pass


def test_bench_prints_its_header_before_the_epochs() -> None:
    out = io.StringIO()
    seen: list[str] = []
    settings = BenchSettings(batch_size=100, epochs=2)
    run_bench(
        out, settings, rows=1000, features=2, chunk_rows=250,
        progress=lambda **kwargs: _Bar(out, seen),
    )  # fmt: skip
    assert len(seen) == 2
    assert seen[0].startswith("data:") and "computing on:" in seen[0]
    assert "stream:       paired_batch_stream(batch_size=100), 10 batches per epoch" in seen[0]
    assert "epoch  batches" not in seen[1]  # the table after the last epoch
    text = out.getvalue()
    assert text.count("data:") == 1 and text.index("data:") < text.index("epoch  batches")
    assert "\n\nepoch  batches" in text  # one blank line between header and table


def test_relative_paths_print_as_given(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    Path(store, "f", "c", "3", "0").unlink()
    argv = ["bench", store, "--array", "f", "--batch-size", "100", "--quiet"]
    assert main([*argv, "--missing", "error"]) == 2
    err = capsys.readouterr().err
    assert "of array x.zarr/f is missing" in err and "file://" not in err
    assert "--missing fill or --missing warn" in err, err
    assert main([*argv, "--missing", "warn"]) == 0
    err = capsys.readouterr().err
    assert "of array x.zarr/f)" in err and "file://" not in err


def test_shuffle_refused_on_resume_names_its_flags(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["shuffle", store, "y.zarr", "--array", "f", "--quiet"]
    assert main(argv) == 0
    assert "of x.zarr to y.zarr" in capsys.readouterr().out
    assert main([*argv, "--seed", "3"]) == 2
    err = capsys.readouterr().err
    assert "pass --overwrite to start over (or --seed 0 to resume)" in err, err
    assert "overwrite=True" not in err and "job_id" not in err
    assert main([*argv, "--chunk-rows", "50"]) == 2
    err = capsys.readouterr().err
    assert "pass --overwrite to start over" in err and "overwrite=True" not in err
    assert main([*argv, "--seed", "3", "--overwrite"]) == 0


def test_site_is_ignored() -> None:
    lines = (ROOT / ".gitignore").read_text(encoding="utf-8").split()
    assert "site/" in lines
