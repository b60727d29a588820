"""Identifiers that reach the generated CUDA: one check for every name.

A name is printed into C++ as it is, so it must be an ASCII C identifier of at most
:data:`MAX_LENGTH` characters that is not a C/C++/CUDA keyword, not reserved by the C++ standard
(``__`` anywhere, ``_`` + capital first), not a macro NVRTC defines (:data:`NVRTC_MACROS`,
:data:`NVRTC_PREFIXES`) and not a name the generated code itself uses
(:data:`GENERATED`: CUDA builtins, the math functions codegen emits, the prelude's helpers).

Two namespaces share a kernel. Users (the builder) may not start a name with ``cb_``, ``CB_`` or
``Cb`` + capital: those prefixes belong to cbrules. Rules may use ``cb_`` (``cb_full_12``,
``cb_box7``, ``cb_s``), so a rule-made name never collides with a user's, and anything ``cb_`` in
a graph came from the rules; rule-made names still may not take one of :data:`GENERATED`.
"""
from __future__ import annotations

import re
from typing import Optional

from ..errors import CbrulesError

MAX_LENGTH = 63  # C's minimum of significant characters in an internal identifier

USER, RULES = "user", "rules"

# C/C++ keywords (NVRTC compiles C++17), plus main: C++ reserves it for the program's entry point
C_KEYWORDS = frozenset("""
    alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
    char32_t class compl concept const consteval constexpr constinit const_cast continue co_await
    co_return co_yield decltype default delete do double dynamic_cast else enum explicit export
    extern false float for friend goto if inline int long mutable namespace new noexcept not not_eq
    nullptr operator or or_eq private protected public register reinterpret_cast requires restrict
    return short signed sizeof static static_assert static_cast struct switch template this
    thread_local throw true try typedef typeid typename union unsigned using virtual void volatile
    wchar_t while xor xor_eq main
""".split())

CUDA_BUILTINS = frozenset(("threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize"))

# Every name the generated kernel uses besides the user's and the rules' own: the prelude's
# helpers and types, codegen's shared-memory block, and the device math functions it calls.
PRELUDE_NAMES = frozenset((
    "CUtensorMap", "cb_smem", "cb_smem_addr", "cb_ceil_div", "cb_min", "cb_max", "cb_elect_sync",
    "cb_elect_one", "cb_mbar_init", "cb_mbar_arrive", "cb_mbar_arrive_expect_tx", "cb_mbar_wait",
    "cb_mbar_inval", "cb_fence_proxy_async", "cb_fence_mbarrier_init", "cb_bar_sync", "cb_tma_load",
    "cb_tma_store", "cb_tma_store_wait", "cb_block_reduce", "CbSum", "CbMax", "CbMin", "CB_WAIT",
    "cb_elect_warp", "cb_block_reduce_named",  # prelude_roles.cu (warp-specialized kernels)
    "cb_bar_arrive",  # cbrules.codegen.cuda.HANDOVER_PRELUDE (ping-pong hand-overs)
    "cb_ex2_approx",  # cbrules.codegen.cuda.EX2_PRELUDE (op exp2_approx)
    "cb_block_stats", "cb_block_stats_named", "cb_block_stats_warps", "cb_block_stats_merge_warps",
    "cb_stats_merge",  # codegen/prelude_stats.cu (block_stats)
    "cb_mbar_wait_backoff",  # cbrules.codegen.cuda.BACKOFF_WAIT (waits with a :backoff)
    # cbrules.codegen.hints (copies with a :cache_hint, waits with a wait mode)
    "cb_tma_load_hint", "cb_tma_store_hint", "cb_tma_store_async_hint", "cb_l2_evict_first", "cb_l2_evict_last",
    "cb_l2_evict_normal", "cb_mbar_wait_mode", "cb_globaltimer",
    "cb_half", "cb_bf16", "cb_e4m3", "cb_e5m2", "CB_FP8_TYPE", "cb_tma_store_async", "cb_bulk_wait_read", "cb_bulk_wait", "cb_swizzle",
    # codegen/mma.py (kernels with mma nodes): the ordering helpers, descriptors, the block's locals and
    # the instruction helper of every N and operand type
    "cb_wgmma_fence", "cb_wgmma_commit", "cb_wgmma_wait", "cb_fence_acc", "cb_wgmma_desc", "cb_a", "cb_b",
    *(f"cb_wgmma_{form}n{n}_{t}{tb}" for form in ("", "rs_") for n in range(8, 257, 8) for t in ("bf16", "f16")
      for tb in ("", "_tb")),
    *(f"cb_wgmma_n{n}_{t}" for n in range(8, 257, 8)
      for t in ("e4m3", "e5m2", "e4m3_e5m2", "e5m2_e4m3")),  # FP8 (K-major only), a mixed pair names B's type
    "cb_pack_bf16x2", "cb_pack_f16x2",  # codegen/mma.py: a register MMA operand's pairs
    "cb_vcopy",  # codegen/prelude_vector.cu (vectorized loads and stores)
    "__shfl_xor_sync", "__shfl_down_sync", "__shfl_up_sync", "__shfl_sync",  # codegen/cuda.py: shfl
))
MATH_FUNCTIONS = frozenset(f + s for f in ("exp", "log", "sqrt", "rsqrt", "fabs", "fma", "tanh", "erf", "exp2", "log2")
                           for s in ("", "f"))
GENERATED = CUDA_BUILTINS | PRELUDE_NAMES | MATH_FUNCTIONS

# Names a term may mention besides identifiers: the CUDA builtins' components
BUILTINS = tuple(f"{b}.{a}" for b in ("threadIdx", "blockIdx", "blockDim", "gridDim") for a in "xyz")

# Macros NVRTC defines in every compile (its built-in headers, found by compiling ``#ifdef NAME`` for
# every name its libnvrtc-builtins defines: tests/test_hostile_names.py probes them again). A name
# that is a macro is replaced before C++ sees it (``NULL`` -> ``__null``), so it cannot name a
# variable. Besides the ``__``/``_X`` names C++ reserves anyway, they are NULL, assert, the va_*
# macros and whole families, reserved by prefix so that a newer NVRTC's additions are covered.
NVRTC_MACROS = frozenset(("NULL", "assert", "va_arg", "va_copy", "va_end", "va_start"))
NVRTC_PREFIXES = re.compile(r"NV_|CUDA_|CUDART|CU_|cuda[A-Z]")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_USER_RESERVED = re.compile(r"cb_|CB_|Cb[A-Z]")
_CXX_RESERVED = re.compile(r"_[A-Z]")
# (name, namespace) pairs known to pass: the verifier asks about every name of a kernel, most of
# them many times (loop variables, barriers, registers of cloned loops)
_FINE: set[tuple[str, str]] = set()


class IdentifierError(CbrulesError, ValueError):
    """A name that cannot be printed into CUDA; ``name`` is the offending name, ``where`` the
    builder call, node or rule that gave it, ``why`` the reason and ``fix`` what to do."""

    def __init__(self, name: object, where: str, why: str, fix: str):
        super().__init__(f"{where}: name {name!r} {why}; {fix}")
        self.name, self.where, self.why, self.fix = name, where, why, fix


class NameClashError(IdentifierError):
    """A valid name already used for something else in the same kernel (or by an enclosing loop)."""


def problem(name: object, namespace: str = USER) -> Optional[tuple[str, str]]:
    """``(why, fix)`` when ``name`` may not reach CUDA from ``namespace`` (USER or RULES), else None."""
    if not isinstance(name, str):
        return f"has type {type(name).__name__}, not str", "give the name as text"
    if (name, namespace) in _FINE:
        return None
    if not _IDENTIFIER.fullmatch(name):
        return ("is not a C identifier (ASCII letters, digits and _, not starting with a digit)",
                f"rename it, e.g. {_suggest(name)!r}")
    if len(name) > MAX_LENGTH:
        return f"is {len(name)} characters long, more than {MAX_LENGTH}", "use a shorter name"
    if name in C_KEYWORDS:
        return "is a C/C++/CUDA keyword or reserved word", f"rename it, e.g. {name + '_'!r}"
    if "__" in name or _CXX_RESERVED.match(name):
        return ("is reserved by C++ (names with '__', or starting with '_' and a capital)",
                f"rename it, e.g. {_suggest(name)!r}")
    if name in NVRTC_MACROS or NVRTC_PREFIXES.match(name):
        return ("is a macro NVRTC defines (or of a family of them: NV_*, CUDA_*, CUDART*, CU_*, cuda + capital), "
                "which the compiler would replace before it sees the name"), f"rename it, e.g. {'my_' + name!r}"
    if name in GENERATED:
        return "is used by the generated CUDA itself (a builtin, math function or prelude helper)", \
            f"rename it, e.g. {'my_' + name!r}"
    if namespace == USER and _USER_RESERVED.match(name):
        return ("starts with a prefix that cbrules keeps for its own names (cb_, CB_, Cb + capital: the "
                "prelude's helpers and rule-made barriers and loops)", f"rename it, e.g. {'my_' + name!r}")
    if len(_FINE) > 65536:
        _FINE.clear()
    _FINE.add((name, namespace))
    return None


def is_valid(name: object, namespace: str = USER) -> bool:
    """True when ``name`` may reach CUDA from ``namespace``."""
    return problem(name, namespace) is None


def check(name: object, where: str, namespace: str = USER) -> str:
    """``name`` itself, or :class:`IdentifierError` saying why it cannot reach CUDA."""
    p = problem(name, namespace)
    if p is not None:
        raise IdentifierError(name, where, *p)
    return name  # type: ignore[return-value]


def check_term_name(name: object, where: str) -> str:
    """A name inside a term: a builtin component such as ``threadIdx.x``, or an identifier."""
    return name if name in BUILTINS else check(name, where, RULES)  # type: ignore[return-value]


def _suggest(name: str) -> str:
    """A valid spelling close to ``name`` for the error message."""
    s = re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9_]", "_", name)).strip("_")[:MAX_LENGTH - 3] or "name"
    s = s if s[0].isalpha() else "n" + s
    return s if problem(s) is None else "my_" + s
