"""The README stays true: its commands, its quick start and its API list."""

from __future__ import annotations

import re
from pathlib import Path

import daskzarr_batches as dzb

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", README, re.M | re.S)
    assert match, f"README has no section {title!r}"
    return match.group(1)


def test_exactly_two_commands_for_a_fresh_machine() -> None:
    commands = re.findall(
        r"```bash\n(.*?)\n```", _section("Two commands for a fresh machine"), re.S
    )
    assert len(commands) == 2
    assert all("\n" not in command for command in commands)
    demo, tests = commands
    assert demo.endswith("daskzarr-batches demo")
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command() -> None:
    tests = re.findall(r"```bash\n(.*?)\n```", _section("Two commands for a fresh machine"), re.S)[
        1
    ]
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert script[-1] == tests
    assert "set -euo pipefail" in script


def test_quick_start_runs() -> None:
    (code,) = re.findall(r"```python\n(.*?)```", _section("Quick start"), re.S)
    exec(compile(code, "README.md quick start", "exec"), {})


def test_every_public_function_is_documented() -> None:
    functions = [name for name in dzb.__all__ if callable(getattr(dzb, name)) and name[0].islower()]
    missing = [name for name in functions if f"`{name}(" not in README]
    assert not missing, f"README does not show the signature of {missing}"
