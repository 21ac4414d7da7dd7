"""README.md and the guides in docs/ stay true: commands, snippets, the list of public names.

Snippets: every ```python block of README.md and of every page under docs/ runs, in the
order of the file,
each in a fresh namespace named ``__main__`` (so a block is complete on its own, as a reader
copies it, and an ``if __name__ == "__main__":`` guard runs its body).  A ```text block
that directly follows a ```python block is that block's exact output.  A block that cannot
run offline (a scheduler address, an object-store URL) is fenced ```python {.no-run} (the
spelling MkDocs renders as a code block, as GitHub does), and must show why: it has to
contain such an address or cluster, so a block that could run is never skipped.

Public names: like httpx's ``tests/test_exported_members.py``, they are pinned: ``__all__``
is the package's public namespace, the table of docs/index.md names exactly the names of
``__all__`` (but ``__version__``), and the API reference pages (generated from the
docstrings by mkdocstrings, built by tests/tools/test_docs.py) document each of them by its
public path.

Commands: the README gives exactly two commands for a fresh machine, the second is
``bash .ci/run`` (both CI legs), each leg's install uses its constraints file, whose pins
satisfy the extras it installs.
"""

from __future__ import annotations

import inspect
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

import daskzarr_batches as dzb

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
INDEX = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
DOCS = {"README.md": README} | {
    path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8")
    for path in sorted((ROOT / "docs").rglob("*.md"))
}
REFERENCE = {name: text for name, text in DOCS.items() if name.startswith("docs/reference/")}
#: The README is the first ten minutes of a newcomer, not the manual.
README_MAX_BYTES = 15_000

#: What a ```python {.no-run} block must contain: something no test machine can reach.
NEEDS_THE_OUTSIDE = re.compile(r"tcp://|s3://|gs://|SLURMCluster\(|KubeCluster\(")
#: Words allowed after ``python`` in a fence's info string.
NO_RUN = "{.no-run}"
FLAGS = {NO_RUN}

PUBLIC = sorted(set(dzb.__all__) - {"__version__"})
#: What the top level may export besides the errors and warnings (``__version__`` counts).
MOST_PUBLIC_NAMES = 36


@dataclass(frozen=True)
class Block:
    """One fenced code block of a Markdown file."""

    file: str
    line: int  # line of the opening fence, 1-based
    language: str
    flags: tuple[str, ...]
    code: str
    output: str | None  # the ```text block right after it, if any

    @property
    def name(self) -> str:
        return f"{self.file}:{self.line}"


def _blocks(file: str, text: str) -> list[Block]:
    fence = re.compile(r"^```([^`\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
    found = list(fence.finditer(text))
    blocks = []
    for i, match in enumerate(found):
        language, *flags = match.group(1).split() or [""]
        output = None
        if i + 1 < len(found):
            following = found[i + 1]
            between = text[match.end() : following.start()]
            if following.group(1).strip() == "text" and not between.strip():
                output = following.group(2)
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(Block(file, line, language, tuple(flags), match.group(2), output))
    return blocks


BLOCKS = [block for file, text in DOCS.items() for block in _blocks(file, text)]
PYTHON = [block for block in BLOCKS if block.language == "python"]
RUN = [block for block in PYTHON if NO_RUN not in block.flags]


def _section(title: str, text: str = README) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"no section {title!r}"
    return match.group(1)


def test_a_newcomer_meets_install_quick_start_and_the_two_commands_first() -> None:
    sections = re.findall(r"^## (.+)$", README, re.M)
    assert sections[:3] == ["Install", "Quick start", "Two commands for a fresh machine"]
    assert any(block.file == "README.md" for block in RUN)
    assert "```python\n" in _section("Quick start")


def test_readme_stays_short() -> None:
    size = len(README.encode("utf-8"))
    assert size < README_MAX_BYTES, f"README.md is {size} bytes; move details into docs/"


def test_exactly_two_commands_for_a_fresh_machine() -> None:
    commands = re.findall(
        r"```bash\n(.*?)\n```", _section("Two commands for a fresh machine"), re.S
    )
    assert len(commands) == 2
    assert all("\n" not in command for command in commands)
    demo, tests = commands
    assert demo.endswith("daskzarr-batches demo")
    assert tests == "bash .ci/run"


def test_ci_runs_both_legs_each_from_its_constraints() -> None:
    run = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    leg = (ROOT / ".ci" / "leg").read_text(encoding="utf-8")
    assert "set -euo pipefail" in run.splitlines() and "set -euo pipefail" in leg.splitlines()
    assert "legs=(pinned newest)" in run
    assert "constraints=constraints.txt extras=test,torch" in leg
    assert "constraints=constraints-newest.txt" in leg and "extras=test,peers" in leg
    assert 'pip" install -q -c "$constraints" -e ".[$extras]"' in leg
    for step in (
        'ruff" check .',
        'ruff" format --check .',
        'mypy" --cache-dir',
        'python" -m pytest -n 2',
    ):
        assert step in leg
    assert "pyenv which python" in (ROOT / ".ci" / "newest-python").read_text(encoding="utf-8")
    # each leg in a venv of its own, never the .venv of the README's demo command
    venvs = re.findall(r"\bvenv=(\S+)", leg)
    assert venvs == [".venv-ci-pinned", ".venv-ci-newest"], venvs
    demo = re.findall(r"```bash\n(.*?)\n```", _section("Two commands for a fresh machine"), re.S)[0]
    assert demo.startswith("python3 -m venv .venv ") and ".venv" not in venvs
    assert ".venv-ci-*/" in (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    # no pip conflict at the zarr releases between the legs: insitubatch needs zarr>=3.3
    between = leg[leg.index("for zarr in") :]
    assert 'pip" uninstall -q -y insitubatch' in leg[: leg.index("for zarr in")]
    assert "zarr insitubatch  # back to the pinned newest" in between
    # the zarr-facing tests the newest leg reruns against older zarr releases exist where named
    named = re.findall(r"tests/[\w/]+\.py", leg)
    assert named and [path for path in named if not (ROOT / path).is_file()] == []


OPTIONAL = ("torch", "jax")  # a snippet importing one is marked for it


@pytest.mark.parametrize(
    "block",
    [
        pytest.param(
            block,
            id=block.name,
            marks=[getattr(pytest.mark, m) for m in OPTIONAL if f"import {m}" in block.code],
        )
        for block in RUN
    ],
)  # a snippet that imports torch (jax) is not collected where it is not installed
def test_snippet_runs_as_written(
    block: Block,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)  # a snippet that writes files writes them here
    # Padded so that a traceback points at the line of the Markdown file.
    code = compile("\n" * block.line + block.code, str(ROOT / block.file), "exec")
    exec(code, {"__name__": "__main__"})
    if block.output is not None:
        assert capsys.readouterr().out == block.output


def test_only_snippets_that_need_the_outside_world_are_not_run() -> None:
    assert PYTHON, "no python blocks found"
    unknown = [(block.name, block.flags) for block in PYTHON if set(block.flags) - FLAGS]
    assert not unknown, f"unknown flags after ```python (the one flag is {NO_RUN}): {unknown}"
    could_run = [
        block.name
        for block in PYTHON
        if NO_RUN in block.flags and not NEEDS_THE_OUTSIDE.search(block.code)
    ]
    assert not could_run, f"no-run blocks that need nothing offline (run them): {could_run}"
    languages = {block.language for block in BLOCKS}
    assert languages <= {"python", "text", "bash", "console"}, languages


def _public_names_table(part: int = 0) -> list[str]:
    """The names of the top level's table (``part=0``) or of ``plan``'s (``part=1``)."""
    section = _section("Public names", INDEX).split("\n### ")[part]
    names = []
    for line in section.splitlines():
        if line.startswith("|"):
            names += re.findall(r"`([A-Za-z_]\w*)`", line.split("|")[1])
    return names


def _is_error(name: str) -> bool:
    value = getattr(dzb, name)
    return inspect.isclass(value) and issubclass(value, Exception | Warning)


def test_the_top_level_is_small_and_keeps_every_error() -> None:
    calls = [name for name in dzb.__all__ if not _is_error(name)]
    assert len(calls) <= MOST_PUBLIC_NAMES, (len(calls), calls)
    from daskzarr_batches import errors

    raised = set(errors.__all__) - {"warn_caller"}  # the public errors and warnings
    assert raised <= set(dzb.__all__), sorted(raised - set(dzb.__all__))
    for name in ("chunk_stream", "batch_stream", "paired_shuffled_batch_stream", "Loader"):
        assert name in dzb.__all__
    assert {"concurrency", "ordered"} <= set(inspect.signature(dzb.chunk_stream).parameters)


def test_plan_internals_are_for_inspection_in_plan() -> None:
    import numpy as np

    import daskzarr_batches.plan as plan
    from daskzarr_batches.streams import StreamSpec

    inside = {"EpochPlan", "Window", "ChunkPiece", "PlanSummary", "WindowSummary"}
    assert inside <= set(plan.__all__)
    assert not (inside | {"StreamSpec"}) & set(dzb.__all__)
    assert dzb.batch_stream(np.zeros((4, 1)), 2).spec.__class__ is StreamSpec
    assert not [name for name in dzb.__all__ if name.startswith("DEFAULT_")]
    for name in plan.__all__:
        assert getattr(plan, name) is not None, name
    assert sorted(_public_names_table(1)) == sorted(plan.__all__)


def test_all_is_the_public_namespace() -> None:
    public = {
        name
        for name, value in vars(dzb).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert public == set(PUBLIC)
    assert len(dzb.__all__) == len(set(dzb.__all__))


def test_public_names_table_names_exactly_all() -> None:
    names = _public_names_table()
    assert len(names) == len(set(names)), "a name appears twice in docs/index.md's table"
    missing = sorted(set(PUBLIC) - set(names))
    extra = sorted(set(names) - set(PUBLIC))
    assert not missing, f"in __all__ but not in docs/index.md's table: {missing}"
    assert not extra, f"in docs/index.md's table but not in __all__: {extra}"


def test_api_reference_documents_every_public_name_by_its_public_path() -> None:
    # mkdocstrings directives, one per object: ``::: daskzarr_batches.Loader``.  Private
    # module paths (``daskzarr_batches._loader.Loader``) move when modules do.
    documented = [
        name for text in REFERENCE.values() for name in re.findall(r"^::: (\S+)$", text, re.M)
    ]
    assert len(documented) == len(set(documented)), "an object is documented twice"
    private = [name for name in documented if "._" in name]
    assert not private, f"reference by public path, not {private}"
    from daskzarr_batches import plan

    expected = {f"daskzarr_batches.{name}" for name in PUBLIC}
    expected |= {f"daskzarr_batches.plan.{name}" for name in plan.__all__}
    expected |= {
        "daskzarr_batches.torch.ZarrIterableDataset",
        "daskzarr_batches.torch.DevicePrefetcher",
        "daskzarr_batches.jax.JaxLoader",
        "daskzarr_batches.jax.process_share",
        "daskzarr_batches.cupy.CupyLoader",
        *(f"daskzarr_batches.readers.{name}" for name in ("ChunkReader", "ChunkRequest")),
        "daskzarr_batches.readers.LibraryReader",  # the reader hook's namespace (issue 36)
        "daskzarr_batches.streams.timing.Bottleneck",  # what bottleneck() returns
        "daskzarr_batches.streams.StreamSpec",  # what stream.spec is
    }
    assert set(documented) == expected, (
        f"missing: {sorted(expected - set(documented))}, "
        f"not public: {sorted(set(documented) - expected)}"
    )


def _pins(name: str = "constraints.txt") -> dict[str, Version]:
    pins = {}
    for line in (ROOT / name).read_text(encoding="utf-8").splitlines():
        line = line.split("#")[0].strip()
        if line:
            requirement = Requirement(line)
            (specifier,) = requirement.specifier
            assert specifier.operator == "==", f"constraints.txt pins exactly: {line}"
            pins[canonicalize_name(requirement.name)] = Version(specifier.version)
    return pins


@pytest.mark.parametrize(
    ("constraints", "extras", "python"),
    [("constraints.txt", ["test", "docs", "jax", "torch"], "3.11"),
     ("constraints-newest.txt", ["test", "docs", "jax", "peers"], "3.13")],
)  # fmt: skip
def test_constraints_pin_every_test_requirement_within_its_range(
    constraints: str, extras: list[str], python: str
) -> None:
    # An extra's floor raised past its pin would make the README's test command fail to
    # resolve; a requirement without a pin would let the resolver wander again.
    pins = _pins(constraints)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = list(project["dependencies"])
    for extra in extras:
        wanted += project["optional-dependencies"][extra]
    for line in wanted:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        if name == "daskzarr-batches":
            continue
        if requirement.marker and not requirement.marker.evaluate({"python_version": python}):
            continue
        assert name in pins, f"{constraints} does not pin {name}"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{constraints} pins {name}=={pins[name]}, outside {requirement.specifier}"
        )


def test_every_extra_is_listed_in_the_readme_and_the_index() -> None:
    """A newcomer finds every extra of pyproject.toml where the install is described."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = sorted(project["optional-dependencies"])
    install = _section("Install")
    table = _section("Install", INDEX)
    assert [e for e in extras if f"`[{e}]`" not in install] == [], "README.md's Install"
    assert [e for e in extras if f"| `[{e}]` |" not in table] == [], "docs/index.md's table"
