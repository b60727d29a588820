"""A Llama-style decoder block forward whose kernels are cbrules', beside eager torch and torch.compile.

    h   = x + o_proj(attention(qkv_proj(rms_norm(x))))        causal, 32 heads of 128
    out = h + down(silu(gate(rms_norm(h))) * up(rms_norm(h)))   SwiGLU MLP

cbrules: ``rms_norm`` (the row kernel), one ``linear`` for Q, K and V, ``attention``, the output
projection with the residual added in its epilogue, one ``linear`` for gate and up side by side,
``swiglu`` and the down projection with the residual in its epilogue (cbrules.torch). The heads are
split and merged by torch's ``permute`` (a copy each way, as the eager block does). Every cbrules call
is a torch custom op on torch's current stream.

    python3 examples/transformer_block.py                    # 16,384 tokens (4 x 4096), d_model 4096
    python3 examples/transformer_block.py --max-autotune     # also torch.compile(mode="max-autotune")
    python3 examples/transformer_block.py --autotune         # cbrules' functions tune themselves first

Prints each implementation's time (each timed alone: a second of sustained launches, then the median of
many, an idle second before each) and the largest difference of each output from eager torch's.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import cbrules.torch as cbt


def make_weights(d: int, heads: int, mlp: int, gen: torch.Generator) -> dict:
    def w(*shape):
        return (torch.randn(*shape, device="cuda", generator=gen) / shape[-1] ** 0.5).bfloat16()
    return {"norm1": (1 + 0.1 * torch.randn(d, device="cuda", generator=gen)).bfloat16(),
            "norm2": (1 + 0.1 * torch.randn(d, device="cuda", generator=gen)).bfloat16(),
            "wqkv": w(3 * d, d), "wo": w(d, d), "w13": w(2 * mlp, d), "w2": w(d, mlp)}


def block_torch(x: torch.Tensor, p: dict, batch: int, heads: int, eps: float = 1e-5) -> torch.Tensor:
    """The block in eager torch (the reference, and what torch.compile compiles)."""
    t, d = x.shape
    length, hd = t // batch, d // heads
    n1 = F.rms_norm(x, (d,), p["norm1"], eps)
    q, k, v = F.linear(n1, p["wqkv"]).view(batch, length, 3, heads, hd).permute(2, 0, 3, 1, 4)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    h = x + F.linear(o.transpose(1, 2).reshape(t, d), p["wo"])
    n2 = F.rms_norm(h, (d,), p["norm2"], eps)
    gate, up = F.linear(n2, p["w13"]).chunk(2, dim=-1)
    return h + F.linear(F.silu(gate) * up, p["w2"])


def block_cbrules(x: torch.Tensor, p: dict, batch: int, heads: int, eps: float = 1e-5) -> torch.Tensor:
    """The same block on cbrules' kernels."""
    t, d = x.shape
    length, hd = t // batch, d // heads
    n1 = cbt.rms_norm(x, (d,), p["norm1"], eps)
    q, k, v = cbt.linear(n1, p["wqkv"]).view(batch, length, 3, heads, hd).permute(2, 0, 3, 1, 4)
    o = cbt.attention(q, k, v, causal=True)
    h = cbt.linear(o.transpose(1, 2).reshape(t, d), p["wo"], residual=x)
    n2 = cbt.rms_norm(h, (d,), p["norm2"], eps)
    return cbt.linear(cbt.swiglu(cbt.linear(n2, p["w13"])), p["w2"], residual=h)


def time_alone(fn, sustain: float = 1.0, samples: int = 30, idle: float = 1.0) -> float:
    """Median seconds of one call of ``fn`` after ``sustain`` seconds of calls (the clocks settle)."""
    torch.cuda.synchronize()
    time.sleep(idle)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < sustain:
        fn()
        torch.cuda.synchronize()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(samples + 1)]
    events[0].record()
    for i in range(samples):
        fn()
        events[i + 1].record()
    events[-1].synchronize()
    return statistics.median(events[i].elapsed_time(events[i + 1]) / 1e3 for i in range(samples))


def main(argv=None) -> int:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--batch", type=int, default=4)
    a.add_argument("--length", type=int, default=4096, help="tokens a sequence (tokens = batch x length)")
    a.add_argument("--d-model", type=int, default=4096)
    a.add_argument("--heads", type=int, default=32)
    a.add_argument("--mlp", type=int, default=11008)
    a.add_argument("--max-autotune", action="store_true", help="also torch.compile(mode='max-autotune') (minutes)")
    a.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    a.add_argument("--autotune", action="store_true", help="cbrules' functions measure their configurations first "
                   "(cached: later runs measure nothing)")
    args = a.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: this example runs on a Hopper GPU", file=sys.stderr)
        return 1
    cbt.set_autotune(args.autotune)
    gen = torch.Generator("cuda").manual_seed(0)
    p = make_weights(args.d_model, args.heads, args.mlp, gen)
    x = torch.randn(args.batch * args.length, args.d_model, device="cuda", generator=gen).bfloat16()
    impls = {"eager torch": lambda: block_torch(x, p, args.batch, args.heads),
             "cbrules": lambda: block_cbrules(x, p, args.batch, args.heads)}
    if not args.no_compile:
        compiled = torch.compile(block_torch)
        impls["torch.compile"] = lambda: compiled(x, p, args.batch, args.heads)
    if args.max_autotune:
        tuned = torch.compile(block_torch, mode="max-autotune")
        impls["torch.compile max-autotune"] = lambda: tuned(x, p, args.batch, args.heads)
    outs = {}
    for label, fn in impls.items():  # first calls: compiles, module loads, autotuning
        t0 = time.perf_counter()
        outs[label] = fn()
        torch.cuda.synchronize()
        print(f"{label}: first call {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    ref = outs["eager torch"].float()
    flops = 2 * x.shape[0] * args.d_model * (4 * args.d_model + 3 * args.mlp) + \
        2 * args.batch * args.heads * args.length ** 2 * (args.d_model // args.heads)  # causal: half of 4 B H L^2 D
    print(f"decoder block: {x.shape[0]} tokens ({args.batch} x {args.length}), d_model {args.d_model}, "
          f"{args.heads} heads, MLP {args.mlp}, bfloat16, causal; {torch.cuda.get_device_name()}")
    print(f"{'implementation':<28} {'ms':>8} {'TFLOP/s':>8} {'x eager':>8} {'max |diff| vs eager':>20}")
    times = {}
    for label, fn in impls.items():
        times[label] = time_alone(fn)
        err = float((outs[label].float() - ref).abs().max())
        print(f"{label:<28} {times[label] * 1e3:8.3f} {flops / times[label] / 1e12:8.0f} "
              f"{times['eager torch'] / times[label]:8.2f} {err:20.4f}", flush=True)
    scale = float(ref.abs().max())
    print(f"(outputs up to {scale:.1f} in magnitude; bfloat16 keeps 8 bits: differences of a few units of "
          f"{scale / 256:.3f} are rounding)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
