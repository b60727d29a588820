"""What may reach the CUDA source as text: identifiers, int literals and index terms, each checked
before it is printed (a name that is not the rules' valid identifier, an int out of range, a term with
an unknown operator or call is a :class:`CodegenError`, never text in the kernel). Shared by the
emitter (:mod:`.cuda`) and the helpers that print one op's statements (:mod:`.mma`, :mod:`.hints`)."""
from __future__ import annotations

from typing import Any

from ..ir.names import BUILTINS, RULES, problem
from ..ir.terms import BINARY_OPS, DEVICE_FUNCTIONS, UNARY_OPS, Term, call_problem, to_c
from .errors import CodegenError

# CUDA's builtins are unsigned; index arithmetic is signed int (C's mixed-sign rules would bite)
BUILTIN_C = {f"{b}.{a}": f"(int){b}.{a}" for b in ("threadIdx", "blockIdx", "blockDim", "gridDim") for a in "xyz"}
# the prelude helper of every device function a term may call (cbrules.ir.terms.DEVICE_FUNCTIONS)
CALL_C = {"elect_one": "cb_elect_one", "elect_warp": "cb_elect_warp", "ceil_div": "cb_ceil_div", "min": "cb_min",
          "max": "cb_max", "swizzle": "cb_swizzle", "byte_perm": "__byte_perm"}  # a CUDA intrinsic: no helper
assert set(CALL_C) == set(DEVICE_FUNCTIONS), "every device function needs its prelude helper"
INT_LITERAL_BOUND = 2 ** 63


def ident(name: Any) -> str:
    """``name`` as it goes into the source, if it is a valid identifier (the rules' namespace: the
    builder already kept users out of cbrules' prefixes), else :class:`CodegenError`."""
    why = problem(name, RULES)
    if why:
        raise CodegenError(f"refusing to print the name {name!r} into CUDA: it {why[0]}; {why[1]}")
    return name


def as_int(v: Any, what: str, low: int = 0) -> int:
    """An int attribute as it goes into the source (a bool, float or text is a CodegenError)."""
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v < INT_LITERAL_BOUND:
        raise CodegenError(f"refusing to print {what} {v!r} into CUDA: it must be an int in {low}..2**63-1")
    return v


def check_term(t: Any) -> None:
    if not isinstance(t, Term):
        raise CodegenError(f"refusing to print {t!r} into CUDA: not a term")
    if t.op == "const":
        v = t.value
        # infinities and NaN print as bit patterns (terms.to_c), which NVRTC takes without headers
        if not isinstance(v, (bool, int, float)) \
                or (isinstance(v, int) and not -INT_LITERAL_BOUND < v < INT_LITERAL_BOUND):
            raise CodegenError(f"refusing to print the constant {v!r} into CUDA: not a number in range")
    elif t.op == "name":
        if t.value not in BUILTINS:
            ident(t.value)
    elif t.op == "call":
        why = call_problem(t.value, len(t.args))
        if why:
            raise CodegenError(f"refusing to print a call into CUDA: {why}")
    elif not ((len(t.args) == 1 and t.op in UNARY_OPS) or (len(t.args) == 2 and t.op in BINARY_OPS)):
        raise CodegenError(f"refusing to print operator {t.op!r} with {len(t.args)} operand(s) into CUDA")
    for a in t.args:
        check_term(a)


def c_term(t: Term) -> str:
    """C text of a checked term, mapping calls onto prelude helpers."""
    check_term(t)
    return to_c(t, CALL_C, BUILTIN_C)
