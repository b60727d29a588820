"""The command table of docs/cli.md and the parser agree: every command is listed, and every option a
row names exists on the commands it names."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from cbrules import cli

CLI_DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


def _rows() -> list[tuple[str, str]]:
    """(command cell, description cell) of each row of docs/cli.md's command table."""
    text = CLI_DOC.read_text()
    rows = []
    for line in text.splitlines():
        m = re.match(r"^\| `([^`]+)` \| (.*) \|$", line)
        if m:
            rows.append((m.group(1).replace("\\|", "|"), m.group(2)))
    return rows


def _subparsers() -> dict:
    p = cli.parser()
    (sub,) = [a for a in p._actions if a.dest == "command"]
    return {"": p, **sub.choices}


def _commands(cell: str, about: str) -> list[str]:
    words = cell.split()
    if words[0] == "...":  # options shared by the commands listed in parentheses
        return re.match(r"^\(([a-z, ]+)\)", about).group(1).replace(" ", "").split(",")
    assert words[0] == "cbrules", cell
    return [""] if words[1].startswith("-") else [words[1]]


def test_the_table_is_found():
    assert len(_rows()) >= 10


def test_every_command_is_in_the_table():
    listed = {c for cell, about in _rows() for c in _commands(cell, about)}
    assert set(_subparsers()) - {""} <= listed, "commands missing from docs/cli.md's table"


@pytest.mark.parametrize("cell, about", _rows(), ids=lambda v: v.split(" |")[0][:40])
def test_every_option_in_a_row_exists(cell, about):
    parsers = _subparsers()
    options = re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", cell)
    for command in _commands(cell, about):
        assert command in parsers, f"docs/cli.md names `cbrules {command}`, which the parser does not have"
        known = parsers[command]._option_string_actions
        missing = [o for o in options if o not in known]
        assert not missing, f"docs/cli.md: `cbrules {command}` with {missing}, which its parser does not take"


def test_a_wrong_option_would_be_caught():
    known = _subparsers()["run"]._option_string_actions
    assert "--size" not in known and "--shape" in known
