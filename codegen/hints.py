"""How a copy or a wait is emitted, as the rules ask it: a TMA copy's L2 cache hint and its tensor
map's L2 promotion, and an mbarrier wait's mode (backoff, exponential backoff, spin-then-sleep, the
try_wait suspend-time hint, a timeout that traps).

Only kernels that use one of these get the helpers (generated here for the ranks and policies they
use), so the source of every other kernel stays as it was. What they print of an attribute goes
through the checked printers of :mod:`cbrules.codegen.ctext`.
"""
from __future__ import annotations

from typing import Any, Iterable

from ..ir.ops import CACHE_HINTS, L2_PROMOTIONS
from ..ir.terms import Term
from .ctext import as_int, c_term
from .errors import CodegenError

# :cache_hint -> the createpolicy primary priority (a fraction of 1.0: the whole access)
_POLICY = {"evict_first": "evict_first", "evict_last": "evict_last", "normal": "evict_normal"}
assert set(_POLICY) == set(CACHE_HINTS)
WAIT_MODE_KEYS = ("backoff_max", "spin", "suspend_hint", "timeout")


def _policy_fn(hint: str) -> str:
    return f"cb_l2_{_POLICY[hint]}"


def _hint(a) -> str:
    hint = a.get("cache_hint")
    if hint not in _POLICY:
        raise CodegenError(f"TMA copy through {a['tmap']}: cache_hint {hint!r} is not one of "
                           f"{', '.join(CACHE_HINTS)}")
    return hint


def tma_load(a, bar: str, coords: str, offset: str) -> str:
    """``cb_tma_load_hint``: the load with ``.L2::cache_hint`` and the policy of its :cache_hint."""
    return (f"cb_tma_load_hint(cb_smem_addr({a['dst']} + {offset}), &{a['tmap']}, {bar}, "
            f"{_policy_fn(_hint(a))}(), {coords});")


def tma_store(a, fn: str, coords: str, offset: str) -> str:
    """``cb_tma_store_hint`` / ``cb_tma_store_async_hint`` (``fn`` names the plain form)."""
    return f"{fn}_hint(&{a['tmap']}, cb_smem_addr({a['src']} + {offset}), {_policy_fn(_hint(a))}(), {coords});"


def _params(rank: int, first: int) -> tuple[str, str, str]:
    """(C parameters, PTX coordinate operands, asm inputs) of a rank-``rank`` copy whose first
    coordinate is operand ``first``."""
    cs = [f"c{i}" for i in range(rank)]
    return (", ".join(f"int {c}" for c in cs), ", ".join(f"%{first + i}" for i in range(rank)),
            ", ".join(f'"r"({c})' for c in cs))


def _copy_helpers(kinds: set[tuple[str, int]]) -> list[str]:
    out = []
    for kind, rank in sorted(kinds):
        if kind == "load":
            ps, ops, ins = _params(rank, 4)
            out.append(f"__device__ __forceinline__ void cb_tma_load_hint(unsigned dst, const CUtensorMap* m, "
                       f"unsigned bar, unsigned long long policy, {ps}) {{\n"
                       f'  asm volatile("cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx'
                       f'::bytes.L2::cache_hint [%0], [%1, {{{ops}}}], [%2], %3;"\n'
                       f'               :: "r"(dst), "l"(m), "r"(bar), "l"(policy), {ins} : "memory");\n}}')
        else:  # store (waits until its source may be reused) or store_async (commits only)
            ps, ops, ins = _params(rank, 3)
            tail = "" if kind == "store" else "\\n cp.async.bulk.commit_group;"
            fn = "cb_tma_store_hint" if kind == "store" else "cb_tma_store_async_hint"
            out.append(f"__device__ __forceinline__ void {fn}(const CUtensorMap* m, unsigned src, "
                       f"unsigned long long policy, {ps}) {{\n"
                       f'  asm volatile("cp.async.bulk.tensor.{rank}d.global.shared::cta.bulk_group.L2::cache_hint '
                       f'[%0, {{{ops}}}], [%1], %2;{tail}"\n'
                       f'               :: "l"(m), "r"(src), "l"(policy), {ins} : "memory");\n'
                       + ("  cb_tma_store_wait();\n" if kind == "store" else "") + "}")
    return out


def _policy_helpers(hints: set[str]) -> list[str]:
    # not volatile: the policy is a pure value, so the compiler may hoist it out of the loop
    return [f"__device__ __forceinline__ unsigned long long {_policy_fn(h)}() {{\n  unsigned long long p;\n"
            f'  asm("createpolicy.fractional.L2::{_POLICY[h]}.b64 %0, 1.0;" : "=l"(p));\n  return p;\n}}'
            for h in sorted(hints)]


WAIT_MODE = r"""// mbarrier_wait with a wait mode: spin polls, then sleep ns between polls (doubling up to max_ns when it
// is not 0); hint: try_wait's suspend-time hint (0: none); timeout_ns: trap with a message after that long
__device__ __forceinline__ unsigned long long cb_globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void cb_mbar_wait_mode(unsigned bar, unsigned parity, unsigned ns, unsigned max_ns,
                                                  unsigned spin, unsigned hint, unsigned long long timeout_ns,
                                                  int node) {
  const unsigned long long start = timeout_ns ? cb_globaltimer() : 0ull;
  for (unsigned polls = 0;;) {
    unsigned done;
    if (hint)
      asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n"
                   " selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(bar), "r"(parity), "r"(hint) : "memory");
    else
      asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                   " selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    if (done) return;
    if (timeout_ns && cb_globaltimer() - start > timeout_ns) {
      printf("cbrules: mbarrier_wait #%d timed out after %llu ns (block %d %d %d, thread %d %d %d, parity %u)\n",
             node, timeout_ns, (int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z, (int)threadIdx.x,
             (int)threadIdx.y, (int)threadIdx.z, parity);
      __trap();
    }
    if (polls < spin) { ++polls; continue; }
    if (ns) __nanosleep(ns);
    if (max_ns) ns = ns == 0 ? 1u : ns < max_ns / 2 ? ns * 2 : max_ns;
  }
}"""


def wait(a, node: int, bar: str, parity: str) -> str:
    """The statement of an mbarrier_wait: the plain poll loop, the fixed-backoff helper (as before
    any other mode existed, so those kernels keep their source) or ``cb_mbar_wait_mode``."""
    backoff = a.get("backoff")
    if isinstance(backoff, Term) and backoff.op == "const":
        backoff = backoff.value
    constant = backoff is None or not isinstance(backoff, Term)
    ns = "0u" if backoff is None else (f"{as_int(backoff, 'a wait backoff', 0)}u" if constant
                                       else f"(unsigned)({c_term(backoff)})")
    if all(a.get(k) is None for k in WAIT_MODE_KEYS) and constant:
        if ns == "0u":  # no sleep between polls: the plain wait (not a loop around __nanosleep(0))
            return f"cb_mbar_wait({bar}, {parity});"
        return f"cb_mbar_wait_backoff({bar}, {parity}, {ns});"
    vals = {k: as_int(a[k], f"a wait's {k}", 1 if k != "spin" else 0) if a.get(k) is not None else 0
            for k in WAIT_MODE_KEYS}
    return (f"cb_mbar_wait_mode({bar}, {parity}, {ns}, {vals['backoff_max']}u, {vals['spin']}u, "
            f"{vals['suspend_hint']}u, {vals['timeout']}ull, {as_int(node, 'a node id', 0)});")


def helpers(steps: Iterable[Any], lines: list[str]) -> list[str]:
    """The helpers the kernel's statements call (none for a kernel without hints or wait modes)."""
    kinds: set[tuple[str, int]] = set()
    hints: set[str] = set()
    for s in steps:
        if s.op in ("tma_load", "tma_store") and s.attrs.get("cache_hint") is not None:
            hints.add(s.attrs["cache_hint"])
            kind = "load" if s.op == "tma_load" else "store" if s.attrs.get("wait", "read") == "read" \
                else "store_async"
            kinds.add((kind, len(s.attrs["coords"])))
    out = _policy_helpers(hints & set(_POLICY)) + _copy_helpers(kinds)
    if any("cb_mbar_wait_mode(" in line for line in lines):
        out.append(WAIT_MODE)
    return out


def l2_promotions(steps: Iterable[Any]) -> tuple[tuple[str, str], ...]:
    """(tensor map, L2 promotion) of every map a copy asks one for; two copies through one map that
    ask for different promotions are a CodegenError (a map has one encoding)."""
    asked: dict[str, tuple[str, int]] = {}
    for s in steps:
        want = s.attrs.get("l2_promotion") if s.op in ("tma_load", "tma_store") else None
        if want is None:
            continue
        if want not in L2_PROMOTIONS:
            raise CodegenError(f"node #{s.node}: l2_promotion {want!r} is not one of {', '.join(L2_PROMOTIONS)}")
        tmap = s.attrs["tmap"]
        if tmap in asked and asked[tmap][0] != want:
            raise CodegenError(f"tensor map {tmap}: node #{asked[tmap][1]} asks for l2_promotion {asked[tmap][0]!r} "
                               f"and node #{s.node} for {want!r}; a map is encoded once: give every copy through "
                               "it the same promotion")
        asked.setdefault(tmap, (want, s.node))
    return tuple(sorted((m, w) for m, (w, _) in asked.items()))
