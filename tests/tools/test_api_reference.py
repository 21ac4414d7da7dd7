"""The API reference tells the truth: what it renders for each parameter is the signature's.

mkdocstrings renders the reference from the numpy docstrings with griffe, so this reads
them the same way, for every public object (``daskzarr_batches.__all__``,
``daskzarr_batches.plan.__all__``, ``daskzarr_batches.torch.ZarrIterableDataset``) and its
public methods and properties, and checks what a reader sees:

- each parameter on its own line (``a, b : int`` renders both with the first's type and
  default), named as in the signature, with a type of its own;
- a documented default (``default X``) is the signature's: its value's ``repr`` (quotes
  either way), the name of the constant it is (``DEFAULT_PREFETCH``), or a byte size that
  is it (``32 MiB``); ``optional`` without a default is a parameter with a default (the
  reference then shows the signature's); a ``bool``, ``int``, ``float`` or ``str``
  annotation is named in the documented type (a ``{"a", "b"}`` choice names a ``str``);
- no raw Sphinx role (``:class:`X```), which mkdocstrings prints as text: link with
  ``[`X`][daskzarr_batches.X]`` (autorefs) or write ``X`` in backticks.

The links themselves resolve or the strict docs build fails (tests/tools/test_docs.py).  Static
(griffe reads the source), so it takes about a second.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import griffe
import pytest

import daskzarr_batches as dzb
import daskzarr_batches.plan as dzplan

ROOT = Path(__file__).resolve().parents[2]
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|exc|data|obj|const|ref):`[^`]+`")
ENTRY = re.compile(r"^(\*{0,2}[A-Za-z_]\w*(?:\s*,\s*\*{0,2}[A-Za-z_]\w*)*)\s*(?::\s*(.*))?$")
DEFAULT = re.compile(r"(?:^|,\s*)default[:=]?\s+(.+)$")
UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "kB": 10**3, "MB": 10**6, "GB": 10**9}


def _public() -> dict[str, Any]:
    """Public path -> runtime object, for every object the reference renders."""
    out = {f"daskzarr_batches.{n}": getattr(dzb, n) for n in dzb.__all__ if n != "__version__"}
    out |= {f"daskzarr_batches.plan.{n}": getattr(dzplan, n) for n in dzplan.__all__}
    try:  # its docstrings are checked either way; its signature where torch is installed
        from daskzarr_batches.torch import ZarrIterableDataset
    except ImportError:
        ZarrIterableDataset = None  # type: ignore[assignment,misc]
    out["daskzarr_batches.torch.ZarrIterableDataset"] = ZarrIterableDataset
    return out


@pytest.fixture(scope="module")
def package() -> griffe.Module:
    loaded = griffe.load("daskzarr_batches", search_paths=[str(ROOT)], docstring_parser="numpy")
    assert isinstance(loaded, griffe.Module)
    return loaded


def _documented(package: griffe.Module) -> list[tuple[str, griffe.Object, Any]]:
    """(public path, griffe object, runtime object or None) of every rendered docstring."""
    out = []
    for path, value in _public().items():
        found = package[path.removeprefix("daskzarr_batches.")]
        target = found.final_target if found.is_alias else found
        out.append((path, target, value))
        if target.is_class:
            for name, member in target.members.items():
                if name.startswith("_") or member.is_alias:
                    continue
                runtime = getattr(value, name, None) if value is not None else None
                out.append((f"{path}.{name}", member, runtime))
    return out


def _parameters_section(text: str) -> list[tuple[str, str | None]]:
    """(names as written, type or None) of each entry of a numpy "Parameters" section."""
    lines = inspect.cleandoc(text).splitlines()
    out: list[tuple[str, str | None]] = []
    for i, line in enumerate(lines):
        if line.strip() == "Parameters" and i + 1 < len(lines) and set(lines[i + 1]) == {"-"}:
            for entry in lines[i + 2 :]:
                if entry.strip() and i + 2 < len(lines) and set(entry.strip()) == {"-"}:
                    out.pop()  # the previous line was the next section's title
                    break
                if entry and not entry[0].isspace():
                    match = ENTRY.match(entry.rstrip("\\ "))
                    out.append((entry, None) if match is None else (match[1], match[2]))
            break
    return out


def _signature(obj: Any, path: str) -> inspect.Signature | None:
    if obj is None:
        return None
    try:
        return inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
    except (TypeError, ValueError):
        return None


def _same_default(written: str, value: Any, source: str | None) -> bool:
    written = written.strip().rstrip(".").strip("`")
    if source is not None and written == source:
        return True
    if written in (repr(value), str(value)) or written.strip("\"'") == str(value):
        return written.strip("\"'") == str(value) or written == repr(value)
    number = re.fullmatch(r"([\d.]+)\s*([KMG]i?B|kB)", written)
    if number and type(value) is int:
        return float(number[1]) * UNITS[number[2]] == value
    return False


def _problems(path: str, obj: griffe.Object, runtime: Any) -> list[str]:
    docstring = obj.docstring
    if docstring is None:
        return []
    wrong = [f"{path}: raw role {role}" for role in ROLE.findall(docstring.value)]
    entries = _parameters_section(docstring.value)
    if not entries:
        return wrong
    signature = _signature(runtime, path)
    function = obj.members.get("__init__") if obj.is_class else obj
    sources = {
        p.name: (str(p.default) if p.default is not None else None)
        for p in getattr(function, "parameters", [])
    }
    for names, kind in entries:
        if "," in names:
            wrong.append(f"{path}: several parameters on one line: {names!r}")
            continue
        name = names.lstrip("*")
        if not kind:
            wrong.append(f"{path}: {name} has no type of its own")
            continue
        if signature is None:
            continue
        parameter = signature.parameters.get(name)
        if parameter is None:
            wrong.append(f"{path}: {name} is documented but not in the signature")
            continue
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        annotation = str(parameter.annotation)
        for simple in ("bool", "int", "float", "str"):
            if annotation == simple and simple not in kind and not kind.startswith("{"):
                wrong.append(f"{path}: {name} is {simple}, documented as {kind!r}")
        default = DEFAULT.search(kind)
        if default is not None:
            if parameter.default is parameter.empty:
                wrong.append(f"{path}: {name} documents a default but has none")
            elif not _same_default(default[1], parameter.default, sources.get(name)):
                wrong.append(
                    f"{path}: {name} documents default {default[1]!r}, "
                    f"the signature's is {parameter.default!r}"
                )
        elif re.search(r"\boptional\b", kind) and parameter.default is parameter.empty:
            wrong.append(f"{path}: {name} is documented optional but must be given")
    return wrong


def test_every_rendered_parameter_matches_its_signature(package: griffe.Module) -> None:
    wrong = [p for path, obj, run in _documented(package) for p in _problems(path, obj, run)]
    assert not wrong, f"{len(wrong)} wrong in the API reference:\n" + "\n".join(wrong)


def test_the_check_catches_what_it_is_for() -> None:
    """Each rule fails on the mistake it is for (the checks above cannot pass vacuously)."""

    def f(a: int = 1, b: bool = False, c: Any = None) -> None:
        """F.

        Parameters
        ----------
        a, b : int
            Two on a line.
        """

    fake = griffe.Function("f", docstring=griffe.Docstring(f.__doc__ or ""))
    assert any("several parameters" in p for p in _problems("f", fake, f))
    fake.docstring = griffe.Docstring("F.\n\nParameters\n----------\na : int, default 2\n    X.\n")
    assert any("documents default '2'" in p for p in _problems("f", fake, f))
    fake.docstring = griffe.Docstring("F.\n\nParameters\n----------\nb : int, optional\n    X.\n")
    assert _problems("f", fake, f) == ["f: b is bool, documented as 'int, optional'"]
    fake.docstring = griffe.Docstring("See :class:`Loader`.")
    assert _problems("f", fake, f) == ["f: raw role :class:`Loader`"]
    fake.docstring = griffe.Docstring(
        "F.\n\nParameters\n----------\nc : object, optional\n    X.\n"
    )
    assert _problems("f", fake, f) == []
    assert _same_default("32 MiB", 32 * 2**20, "DEFAULT_WINDOW_BYTES")
    assert _same_default('"warn"', "warn", None) and not _same_default('"fill"', "warn", None)
