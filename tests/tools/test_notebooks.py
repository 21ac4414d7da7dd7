"""Every notebook in ``notebooks/`` executes without an error and prints what it shows.

The saved outputs are what a reader sees on GitHub, so each run is compared with them
(``comparable``): per code cell, its stdout and the plain-text form of its results, in
order, with what differs from run to run normalised away (timings and rates, tqdm's
progress bars, memory addresses, temporary paths, network addresses and ports).  Not
compared: stderr (warnings, cluster logs), images and HTML (plots; their text form, such
as ``<Figure size 700x300 with 1 Axes>``, is), and the outputs of a cell tagged
``output-varies`` (what a cluster finished before an interruption, say): it still runs, and
asserts what must hold.  A notebook whose output changed on
purpose is saved again with the command below, and the diff shows what changed.

Each notebook runs top to bottom in a fresh ``python3`` kernel (jupyter_client
starts it with this interpreter) whose working directory is the repository
root and whose ``PYTHONPATH`` starts with it, so the kernel imports this
checkout's ``daskzarr_batches`` even when another copy is installed.

Run as a script to execute notebooks and store their outputs in place (the
committed notebooks carry outputs so they read well on GitHub)::

    python tests/tools/test_notebooks.py                      # every notebook
    python tests/tools/test_notebooks.py notebooks/NAME.ipynb  # just these
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
#: Seconds one cell may run (cluster notebooks start a LocalCluster).
CELL_TIMEOUT = 240


def execute(path: Path) -> nbformat.NotebookNode:
    """Execute the notebook at ``path`` in a fresh kernel and return it with outputs."""
    notebook = nbformat.read(path, as_version=4)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # quiet debugpy warning
    client = NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=CELL_TIMEOUT,
        record_timing=False,
        resources={"metadata": {"path": str(ROOT)}},  # the kernel's working directory
    )
    client.execute(env=env)
    return notebook


def test_there_are_notebooks() -> None:
    assert NOTEBOOKS, f"no notebooks found in {ROOT / 'notebooks'}"


def _needs(path: Path) -> list[pytest.MarkDecorator]:
    """A notebook that imports torch (jax) is not collected where it is not installed."""
    text = path.read_text(encoding="utf-8")
    return [getattr(pytest.mark, name) for name in ("torch", "jax") if f"import {name}" in text]


#: the tag of a cell whose outputs are not compared (they vary with timing; it asserts)
VARIES = "output-varies"
#: (pattern, replacement) applied in order to every compared output
NORMALISE = [
    (re.compile(r"^.*\d+%\|.*\|.*$", re.M), "<progress bar>"),  # tqdm: rates, times
    (re.compile(r"0x[0-9a-fA-F]+"), "0x<address>"),
    (re.compile(r"(?:/private)?/(?:tmp|var/folders)/[^\s'\")]+"), "<tmp path>"),
    (re.compile(r"\b(?:tcp|inproc|ws|http)://[^\s'\")]+"), "<network address>"),
    (re.compile(r"\b(?:127\.0\.0\.1|localhost):\d+"), "<network address>"),
    (re.compile(r"\d+(?:\.\d+)?(?:e-?\d+)?\s?(?:samples/s|[kKMG]i?B/s|it/s|s/it)"), "<rate>"),
    (re.compile(r"\b\d+(?:\.\d+)?(?:e-?\d+)?\s?(?:ms|µs|us|ns|s|sec|seconds)\b"), "<time>"),
]


def _normalised(text: str) -> str:
    for pattern, replacement in NORMALISE:
        text = pattern.sub(replacement, text)
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def comparable(notebook: nbformat.NotebookNode) -> list[list[str]]:
    """Per code cell, what is compared of its outputs (see the module docstring)."""
    cells = []
    for cell in coalesce_streams(notebook).cells:
        if cell.cell_type != "code":
            continue
        if VARIES in cell.get("metadata", {}).get("tags", []):
            cells.append([])
            continue
        shown = []
        for output in cell.get("outputs", []):
            kind = output.get("output_type")
            if kind == "stream" and output.get("name") == "stdout":
                shown.append(_normalised(output["text"]))
            elif kind in ("execute_result", "display_data") and "text/plain" in output["data"]:
                shown.append(_normalised(output["data"]["text/plain"]))
            elif kind == "error":
                shown.append(f"error {output.get('ename')}")
        cells.append([text for text in shown if text])
    return cells


@pytest.mark.parametrize("path", [pytest.param(p, marks=_needs(p), id=p.name) for p in NOTEBOOKS])
def test_notebook_executes(path: Path) -> None:
    saved = comparable(nbformat.read(path, as_version=4))
    try:
        notebook = execute(path)
    except CellExecutionError as exc:  # the message shows the cell and its traceback
        pytest.fail(f"{path.name} failed:\n{exc}", pytrace=False)
    errors = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]
    assert not errors, f"{path.name} has error outputs: {errors}"
    now = comparable(notebook)
    differ = [
        f"code cell {i}:\n  saved: {old!r}\n  now:   {new!r}"
        for i, (old, new) in enumerate(zip(saved, now, strict=True))
        if old != new
    ]
    assert not differ, (
        f"{path.name} prints other outputs than it saved (save it again: "
        f"python tests/tools/test_notebooks.py notebooks/{path.name}):\n" + "\n".join(differ)
    )


def test_the_comparison_sees_changes_but_not_timings() -> None:
    def notebook(*texts: str) -> nbformat.NotebookNode:
        cell = nbformat.v4.new_code_cell("pass")
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=t) for t in texts]
        return nbformat.v4.new_notebook(cells=[cell])

    a = notebook("took 1.25 s at 120.5 samples/s from /tmp/tmpab12/x.zarr\n", "more\n")
    b = notebook("took 0.5 s at 99 samples/s from /tmp/tmpzz/x.zarr\nmore\n")
    assert comparable(a) == comparable(b) == [["took <time> at <rate> from <tmp path>\nmore"]]
    assert comparable(notebook("batch [0. 5. 1. 2.]")) != comparable(notebook("batch [0. 1.]"))
    bar = "epoch 0: 100%|███| 79/79 [00:00<00:00, 651.26it/s, loss=0.108]"
    assert comparable(notebook(bar)) == [["<progress bar>"]]
    varies = notebook("units_written=9")
    varies.cells[0].metadata["tags"] = [VARIES]
    assert comparable(varies) == [[]]


def test_notebook_kernel_imports_this_checkout(tmp_path: Path) -> None:
    probe = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(
                "import daskzarr_batches, sys\nprint(daskzarr_batches.__file__)\n"
                "print(sys.executable)"
            )
        ]
    )
    probe.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    path = tmp_path / "probe.ipynb"
    nbformat.write(probe, path)
    printed = execute(path).cells[0].outputs[0]["text"].splitlines()
    assert Path(printed[0]).resolve().parent == ROOT / "daskzarr_batches"
    assert Path(printed[1]).resolve() == Path(sys.executable).resolve()


def coalesce_streams(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Merge each cell's consecutive outputs to one stream (stdout, stderr) into one.

    How a cell's prints split into outputs depends on when the kernel flushed them,
    so without this the stored outputs of a cell that prints, works, then prints again
    differ from run to run.
    """
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        merged: list[nbformat.NotebookNode] = []
        for output in cell.get("outputs", []):
            previous = merged[-1] if merged else None
            if (
                previous is not None
                and output.get("output_type") == "stream"
                and previous.get("output_type") == "stream"
                and previous.get("name") == output.get("name")
            ):
                previous["text"] += output["text"]
            else:
                merged.append(output)
        cell["outputs"] = merged
    return notebook


if __name__ == "__main__":
    targets = [Path(arg).resolve() for arg in sys.argv[1:]] or NOTEBOOKS
    for target in targets:
        nbformat.write(coalesce_streams(execute(target)), target)
        print(f"executed and saved {target.relative_to(ROOT)}")
