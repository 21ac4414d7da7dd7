"""Every notebook in ``notebooks/`` executes without an error, so none can rot.

Each notebook runs top to bottom in a fresh ``python3`` kernel (jupyter_client
starts it with this interpreter) whose working directory is the repository
root and whose ``PYTHONPATH`` starts with it, so the kernel imports this
checkout's ``daskzarr_batches`` even when another copy is installed.

Run as a script to execute notebooks and store their outputs in place (the
committed notebooks carry outputs so they read well on GitHub)::

    python tests/test_notebooks.py                      # every notebook
    python tests/test_notebooks.py notebooks/NAME.ipynb  # just these
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]
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


@pytest.mark.parametrize("path", [pytest.param(p, marks=_needs(p), id=p.name) for p in NOTEBOOKS])
def test_notebook_executes(path: Path) -> None:
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
