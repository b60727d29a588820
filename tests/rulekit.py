"""Helpers for tests that write rule files into temporary folders."""
import textwrap
from pathlib import Path

from cbrules.rewrite import rulefile


def write_rules(folder: Path, text: str, name: str = "test.rules") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def load_only(folder: Path) -> rulefile.RuleSet:
    """Rules of ``folder`` alone (no shipped rules)."""
    return rulefile.load([folder])
