"""Why is a generated kernel as fast as it is? Writes, for one benchmark op and its variants, the
CUDA source, the cubin, ptxas's resource line and, where a disassembler is on the PATH
(``cuobjdump``, as on the H200 image), the SASS with an instruction-class count of each loop.

    python3 benchmarks/sass.py --op exp --stages 3 --param rows=1 --param width=1024 --out /tmp/sass
    python3 benchmarks/sass.py --op matmul --stages 4 --warp-specialize --registers 40,232 ...
    python3 benchmarks/sass.py --kernel matmul_tc --stages 4 --warp-specialize --registers 40,232 --out /tmp/sass

For a warp-specialized variant it also reports whether ptxas kept the setmaxnreg instructions
(SASS ``USETMAXREG``) and any local-memory traffic (``LDL``/``STL``: spills or stack arrays).

Needs NVRTC only (no GPU); the disassembly needs the CUDA toolkit's cuobjdump.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.ops import OPS, build_variant  # noqa: E402

_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_]+)?([^;]*);")


def loop_histograms(sass: str) -> list[collections.Counter]:
    """Instruction counts (opcode and first modifier) of each loop in ``sass`` (a backward branch to
    a hex address): the steady-state code, where a streaming kernel spends its time."""
    instrs = [m.groups() for m in map(_INSTR.match, sass.splitlines()) if m]
    where = {int(addr, 16): i for i, (addr, *_) in enumerate(instrs)}
    loops = []
    for i, (addr, _pred, op, _mod, rest) in enumerate(instrs):
        target = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if target and int(target.group(1), 16) < int(addr, 16) and int(target.group(1), 16) in where:
            body = instrs[where[int(target.group(1), 16)]:i + 1]
            loops.append(collections.Counter(o + (m or "") for _a, _p, o, m, _r in body))
    return loops


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--op", choices=sorted(OPS))
    which.add_argument("--kernel", help="a built-in kernel by name (its factory's defaults), e.g. matmul_tc")
    p.add_argument("--stages", default="3", help="comma-separated S values (1: not annotated)")
    p.add_argument("--param", action="append", default=[],
                   help="NAME=VALUE build parameter (repeatable; an int, or text such as dtype=bfloat16)")
    p.add_argument("--war", default=None)
    p.add_argument("--warp-specialize", action="store_true", help="the warp-specialized variant")
    p.add_argument("--registers", help="with --warp-specialize: P,C registers (setmaxnreg)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)

    from cbrules import api

    params = {k: int(v) if v.isdigit() else v for k, v in (kv.split("=", 1) for kv in a.param)}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tool = shutil.which("cuobjdump")
    for stages in (int(s) for s in a.stages.split(",")):
        ws = {"warp_specialize": True, "registers": tuple(int(x) for x in a.registers.split(",")) if a.registers
              else None} if a.warp_specialize else {}
        ck = api.compile(build_variant(OPS[a.op].kernel if a.op else a.kernel, stages, war=a.war, **ws, **params))
        stem = f"{a.op or a.kernel}_S{stages}" + ("_ws" if ws else "") + (f"_r{a.registers.replace(',', '-')}" if ws and
                                                              a.registers else "") \
            + "".join(f"_{k}{v}" for k, v in params.items())
        (out / f"{stem}.cu").write_text(ck.source.text)
        (out / f"{stem}.cubin").write_bytes(ck.cubin.cubin)
        r = ck.cubin.resources
        print(f"{stem}: {r.registers} regs, {ck.source.shared_bytes} B dynamic smem, "
              f"{r.spill_stores}/{r.spill_loads} B spill st/ld, {r.stack_bytes} B stack")
        if not tool:
            continue
        sass = subprocess.run([tool, "--dump-sass", str(out / f"{stem}.cubin")], capture_output=True,
                              text=True, check=True).stdout
        (out / f"{stem}.sass").write_text(sass)
        ops = collections.Counter(m.group(3) for m in map(_INSTR.match, sass.splitlines()) if m)
        print(f"  setmaxnreg in SASS: {ops['USETMAXREG']} USETMAXREG; local memory: {ops['LDL']} LDL, "
              f"{ops['STL']} STL; tensor cores: {sum(n for o, n in ops.items() if o.startswith('HGMMA'))} HGMMA")
        for i, h in enumerate(loop_histograms(sass)):
            print(f"  loop {i}: {sum(h.values())} instructions: "
                  + ", ".join(f"{op} {n}" for op, n in h.most_common(14)))
    if not tool:
        print("cuobjdump not on the PATH: wrote sources and cubins only")
    return 0


if __name__ == "__main__":
    sys.exit(main())
