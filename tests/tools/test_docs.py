"""The documentation site builds with ``mkdocs build --strict``: no warning passes.

``mkdocs.yml`` turns every check MkDocs has into a warning (a page left out of the
navigation, a link to a missing page or anchor), and mkdocstrings warns about a
docstring it cannot read or an object it cannot find, so a renamed public name or a
broken link fails here.  The build is offline (no plugin fetches anything) and takes a
few seconds; it runs in a subprocess so that MkDocs' own deprecation warnings do not meet
pytest's ``filterwarnings = error``.  What the pages say is checked by test_readme.py
(their code blocks run; the public names are in step with ``__all__``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    env = dict(os.environ)
    # The checkout first, as for the notebooks: mkdocstrings reads this tree's docstrings.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["NO_MKDOCS_2_WARNING"] = "1"  # mkdocs-material's banner about MkDocs 2.0
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log
    warnings = [line for line in log.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert not warnings, "\n".join(warnings)
    assert (tmp_path / "reference" / "loader" / "index.html").is_file()
    loader = (tmp_path / "reference" / "loader" / "index.html").read_text(encoding="utf-8")
    assert 'id="daskzarr_batches.torch.ZarrIterableDataset"' in loader


#: the most lines a page may have (issue 30): past them it is split, or its detail moves to
#: the feature pages it links to
MOST_PAGE_LINES = {"architecture.md": 450, "benchmarks.md": 700}


def test_the_long_pages_stay_short() -> None:
    lines = {
        name: len((ROOT / "docs" / name).read_text(encoding="utf-8").splitlines())
        for name in MOST_PAGE_LINES
    }
    too_long = {name: n for name, n in lines.items() if n > MOST_PAGE_LINES[name]}
    assert too_long == {}, f"pages over their line limit {MOST_PAGE_LINES}: {too_long}"
