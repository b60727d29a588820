"""Probe (not the product; once measured, its finding goes to FINDINGS.md and the probe goes):
FlashAttention-3's two schedules together, edited into the CUDA of the warp-specialized attention
kernel, against the kernel as the rules make it.

* overlap: iteration t issues S_t = Q K_t^T, then P_{t-1} V_{t-1}, waits for all but one group (S_t),
  runs the softmax of S_t under P V, then waits for P V, frees slot t-1, rescales O and converts P_t;
  the last P V after the loop. (Session 12 measured this alone as a rule: flat.)
* pingpong: on top of it, the consumer warp groups take turns issuing [S_t, P_{t-1} V_{t-1}] through a
  ring of named barriers (8 + g), so one group's softmax runs under another's MMAs. (Session 12 measured
  a hand-over around the original MMA issue alone: slower.)

    python3 benchmarks/attn_fa3_probe.py            # quick timing, D 64/128/256, L 1k/4k/16k
    python3 benchmarks/attn_fa3_probe.py --compile  # only check that every edited kernel compiles (CPU)
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import sys


def _block(lines: list[str], start: int) -> int:
    """Index of the line closing the brace opened on ``lines[start]``."""
    depth = 0
    for i in range(start, len(lines)):
        depth += lines[i].count("{") - lines[i].count("}")
        if depth == 0:
            return i
    raise ValueError("unbalanced braces")


def edit(text: str, groups: int, pingpong: bool) -> str:
    lines = text.split("\n")
    head = next(i for i, ln in enumerate(lines) if re.match(r"\s*for \(int t = 0; t < .*\) \{  // consumer", ln))
    end = _block(lines, head)
    bound = re.match(r"\s*for \(int t = 0; t < (.*); t \+= 1\)", lines[head]).group(1)
    body = lines[head + 1:end]
    fences = [i for i, ln in enumerate(body) if ln.strip() == "cb_wgmma_fence();"]
    commits = [i for i, ln in enumerate(body) if ln.strip() == "cb_wgmma_commit();"]
    waits0 = [i for i, ln in enumerate(body) if ln.strip().startswith("cb_wgmma_wait<0>();")]
    assert len(fences) == 2 and len(commits) == 2 and len(waits0) >= 3, (fences, commits, waits0)
    full_wait = body[:fences[0]]
    s_issue = body[fences[0]:commits[0] + 1]
    wait_line = body[waits0[0]]
    rel_start = waits0[0] + 1
    assert body[rel_start].strip() == "if (t > 0) {"
    rel_end = _block(body, rel_start)
    release_prev = body[rel_start:rel_end + 1]
    softmax = body[rel_end + 1:waits0[1]]
    rescale_convert = body[waits0[1] + 1:fences[1]]
    pv = body[fences[1]:commits[1] + 1]
    stages = int(re.search(r"\[t % (\d+)\]", "\n".join(full_wait)).group(1))
    last_rel = next(ln for ln in body[commits[1]:] if "cb_mbar_arrive" in ln).strip()
    # after the wait for S alone: only S's registers are settled (P V still writes O)
    s_fence = " ".join(f"cb_fence_acc<{n}>(s);" for n in re.findall(r"cb_fence_acc<(\d+)>\(s\)", wait_line))
    pv_prev = [ln.replace(f"t % {stages}", f"(t + {stages - 1}) % {stages}") for ln in pv]
    ind = "      "
    wg = "((int)threadIdx.x / 128)"
    new = list(full_wait)
    if pingpong:
        new.append(f"{ind}cb_bar_sync(8 + {wg}, 256);")
    new += s_issue + [f"{ind}if (t > 0) {{"] + pv_prev + [f"{ind}}}"]
    if pingpong:
        new.append(f'{ind}if (!({wg} == {groups - 1} && t == {bound} - 1)) '
                   f'asm volatile("bar.arrive %0, 256;" :: "r"(8 + ({wg} + 1) % {groups}) : "memory");')
    new += [f"{ind}if (t > 0) {{ cb_wgmma_wait<1>(); }} else {{ cb_wgmma_wait<0>(); }}",
            f"{ind}{s_fence.strip()}"]
    new += softmax + [wait_line] + release_prev + rescale_convert
    last = [ln.replace(f"t % {stages}", f"({bound} - 1) % {stages}") for ln in pv]
    tail = [f"    if ({bound} > 0) {{"] + last + [f"      {wait_line.strip()}",
                                                  "      " + last_rel.replace(f"t % {stages}", f"({bound} - 1) % {stages}"),
                                                  "    }"]
    before = []
    if pingpong:
        before = [f'    if ({wg} == {groups - 1} && {bound} > 0) asm volatile("bar.arrive 8, 256;" ::: "memory");']
    out = lines[:head] + before + [lines[head]] + new + [lines[end]] + tail + lines[end + 1:]
    return "\n".join(out)


def build(d: int, causal: bool, variant: str):
    from cbrules import api
    from cbrules.codegen.cuda import emit
    from cbrules.codegen.launch import CompiledKernel
    from cbrules.codegen.nvrtc import compile_cuda
    from cbrules.kernels.attention import attention, default_bm
    from cbrules.schedule import schedule
    src = emit(schedule(api.lower(attention(head_dim=d, causal=causal, warp_specialize=True))))
    if variant != "base":
        src = dataclasses.replace(src, text=edit(src.text, default_bm(d) // 64, variant == "overlap+pingpong"))
    return CompiledKernel(src, compile_cuda(src.text, src.name))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--compile", action="store_true", help="only compile every variant (no GPU needed)")
    p.add_argument("--dims", default="64,128,256")
    p.add_argument("--lengths", default="1024,4096,16384")
    a = p.parse_args(argv)
    variants = ("base", "overlap", "overlap+pingpong")
    dims = [int(x) for x in a.dims.split(",")]
    kernels = {(d, c, v): build(d, c, v) for d in dims for c in (False, True) for v in variants}
    print(f"compiled {len(kernels)} kernels", flush=True)
    if a.compile:
        return 0
    import torch
    from benchmarks.steady import time_alone
    heads, tokens = 16, 32768
    for d in dims:
        for causal in (False, True):
            for length in (int(x) for x in a.lengths.split(",")):
                b = tokens // length
                q, k, v = (torch.randn(b * heads, length, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                cells = []
                for variant in variants:
                    o = torch.full_like(q, float("nan"))
                    bound = kernels[(d, causal, variant)].bind(q=q, k=k, v=v, o=o)
                    r = time_alone(bound.launch, torch, sustain=0.6, samples=40, idle=1.0)
                    err = float((o.float() - ref.float()).abs().max())
                    flops = 4 * b * heads * length * length * d / (2 if causal else 1)
                    cells.append(f"{variant} {flops / r['seconds'] / 1e12:.0f} (err {err:.3f})")
                print(f"D={d} L={length} causal={causal}: " + ", ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
