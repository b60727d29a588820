"""cbrules: declarative graph-rewrite rules that turn GPU kernels into TMA circular-buffered Hopper kernels.

The pipeline, one sub-package or module per part, each importing only the parts before it:

- :mod:`cbrules.ir` — the kernel graph, its op table, terms, names, verifier and sibling order, and
  the builder that makes a graph from a kernel written in Python;
- :mod:`cbrules.rewrite` — the rule engine: the rule-file reader, its schema, matcher, actions,
  engine and the egglog bridge for index terms;
- :mod:`cbrules.schedule` — the scheduler: a lowered graph as a linear program (:class:`Step` tree);
- :mod:`cbrules.codegen` — CUDA C++ from a schedule, NVRTC, the launcher (consumes only the schedule);
- :mod:`cbrules.reference` — the reference interpreter and the protocol checker that judge a lowering;
- :mod:`cbrules.api` orchestrates them; :mod:`cbrules.cli` is the command line; :mod:`cbrules.trace`,
  :mod:`cbrules.tracefile` and :mod:`cbrules.viewer` explain a lowering.

Importing ``cbrules`` loads nothing heavy: each command imports what it uses.
"""
from __future__ import annotations

import importlib.util
import sys

from .shipped import CODEGEN, PACKAGE

__version__ = "0.1.0"


def _adopt_checkout_codegen() -> None:
    # In a source checkout codegen/ sits beside cbrules/ (an install maps it inside): register it as
    # cbrules.codegen so both layouts import it by one name and nothing named `codegen` is top-level.
    if CODEGEN.parent == PACKAGE or __name__ + ".codegen" in sys.modules or not (CODEGEN / "__init__.py").is_file():
        return
    spec = importlib.util.spec_from_file_location(__name__ + ".codegen", CODEGEN / "__init__.py",
                                                  submodule_search_locations=[str(CODEGEN)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    globals()["codegen"] = module


_adopt_checkout_codegen()
