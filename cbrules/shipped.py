"""Where the files cbrules ships sit: the rule files and the code generator (with its CUDA preludes).

An install (``pip install .``) puts both inside the package, as ``cbrules/rules`` (package data) and
``cbrules/codegen`` (mapped from the top-level ``codegen/`` folder by ``pyproject.toml``). A source
checkout, run with ``PYTHONPATH=<repo root>`` or installed with ``pip install -e .``, keeps them
beside the package in the top-level ``rules/`` and ``codegen/`` folders, so an edit there is what
``cbrules`` runs.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def shipped(folder: str) -> Path:
    """The folder ``folder`` of the installed package, or of the checkout this package runs from."""
    inside = PACKAGE / folder
    return inside if inside.is_dir() else PACKAGE.parent / folder


RULES = shipped("rules")
CODEGEN = shipped("codegen")


def shown(path: str | os.PathLike) -> str:
    """``path`` as a user reads it (rule positions, builder call sites, annotations, the viewer):
    relative to the working directory when it lies below it; a file cbrules ships by its place in
    cbrules (``rules/circular_buffer.rules``, ``cbrules/kernels/tiled2d.py``), not by the
    site-packages path it was installed to; anything else as given."""
    return _shown(os.fspath(path), os.getcwd())


@functools.lru_cache(maxsize=1024)  # a kernel's build asks it once an op (~1,000 for attention)
def _shown(path: str, cwd: str) -> str:
    full = os.path.abspath(path)
    rel = os.path.relpath(full, cwd)
    if not rel.startswith(".."):
        return rel
    for root, name in ((RULES, "rules"), (CODEGEN, "codegen"), (PACKAGE, "cbrules")):
        if full.startswith(str(root) + os.sep):
            return name + "/" + os.path.relpath(full, root).replace(os.sep, "/")
    return path
