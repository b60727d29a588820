"""Where the files cbrules ships sit: the rule files and the code generator (with its CUDA preludes).

An install (``pip install .``) puts both inside the package, as ``cbrules/rules`` (package data) and
``cbrules/codegen`` (mapped from the top-level ``codegen/`` folder by ``pyproject.toml``). A source
checkout, run with ``PYTHONPATH=<repo root>`` or installed with ``pip install -e .``, keeps them
beside the package in the top-level ``rules/`` and ``codegen/`` folders, so an edit there is what
``cbrules`` runs.
"""
from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def shipped(folder: str) -> Path:
    """The folder ``folder`` of the installed package, or of the checkout this package runs from."""
    inside = PACKAGE / folder
    return inside if inside.is_dir() else PACKAGE.parent / folder


RULES = shipped("rules")
CODEGEN = shipped("codegen")
