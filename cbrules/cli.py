"""The ``cbrules`` command line: demo, kernels, ops, lower, rules, trace, compile, run, check.

Each command imports what it uses (numpy, networkx, egglog, CUDA load only where needed), so
``--help``, ``--version``, ``kernels``, ``ops`` and ``rules`` start fast. User errors never end in a Python traceback: a named error prints one line (exit 1), a wrong
command line prints one line (exit 2), anything else is a bug in cbrules and prints one line
saying so (exit 3; ``CBRULES_TRACEBACK=1`` shows the traceback).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import warnings
from typing import Callable, Iterator, Optional, Sequence

from . import __version__, cli_output
from .errors import CbrulesError, CliError
from .ir import option_schema
from .ir.limits import MAX_CHECK_STAGES
from .ir.ops import STORAGE_DTYPES
from .rewrite import rulefile
from .shipped import shown
from .userio import printable, write_text
from .cli_check import cmd_check
from .cli_progress import progress_lines
from .cli_kernel import compile_kernel, dtype_of, kernel_of, lowering_options, rule_folders, run_kernel, shape_of, load_spec


TRACEBACK_VAR = "CBRULES_TRACEBACK"
EXIT_CODES = ("exit codes: 0 success; 1 a named error (the kernel, the rules or a check failed); 2 a wrong "
              f"command line; 3 an internal error (a bug: rerun with {TRACEBACK_VAR}=1 and report the "
              "traceback); 130 interrupted; 141 stdout closed (e.g. piped into head)")


def cmd_kernels(a) -> int:
    from .kernels import CATALOG
    width = max(map(len, CATALOG))
    for name, doc in sorted(CATALOG.items()):
        print(f"{name:{width}s}  {doc}")
    return 0


def cmd_ops(a) -> int:
    from .ir.ops import COMMON_DOC, OP_DOCS, OPS
    for op, spec in OPS.items():
        def names(keys):
            return " ".join(f":{k}" + ("*" if k in spec.terms else "") for k in keys) or "-"
        print(f"{op:26s} {spec.category:8s} {OP_DOCS[op]}")
        defaults = "".join(f"; :{k} defaults to {v!r}" for k, v in spec.defaults.items())
        print(f"{'':35s} required {names(spec.required)}; optional {names(spec.optional)}{defaults}")
    print(f"\n* the attribute holds a term (an index expression the rules and egglog rewrite)\n{COMMON_DOC}")
    return 0


def cmd_options(a) -> int:
    for opt in option_schema.options().values():
        values = {"int": "an int", "bool": "True or False", "word": " or ".join(f'"{c}"' for c in opt.choices),
                  "pair": "a pair of ints", "count": f"True ({opt.true}) or a count"}[opt.type]
        values += f' or "{option_schema.AUTO}"' if opt.auto else ""
        bounds = ", ".join(f"{k} {getattr(opt, k)}" for k in ("min", "max") if getattr(opt, k) is not None)
        default = "none (not given: absent)" if opt.default is None else str(opt.default)
        print(f"{opt.name:18s} {values}{'; ' + bounds if bounds else ''}; default {default}"
              f"{'; ' + opt.flag if opt.flag else ''}")
        print(f"{'':18s} {opt.doc}")
        if opt.refusals:
            print(f"{'':18s} refused by name: " + ", ".join(f"{code} ({rule})" for code, rule, _ in opt.refusals))
    print(f"\ndeclared in {shown(option_schema.SCHEMA_FILE)}; a default in parentheses is computed from the loop's "
          "other options (an option not given counts as its own default)")
    return 0


def cmd_lower(a) -> int:
    from . import api, options, trace
    from .schedule import print_program, schedule
    spec = load_spec(a)
    built = kernel_of(a, spec)
    kg = api.lower(built, **lowering_options(a))
    print(options.describe(kg, built.graph))
    print(print_program(schedule(kg), ids=True))  # #id: the node ids --debug and `cbrules trace` name
    if kg.trace is not None:
        print("\n".join(trace.describe(r) for r in kg.trace.records))
    return 0


def cmd_rules(a) -> int:
    rule_folders(a)
    # a user folder adds to the shipped rules (its phases and disables refer to them), so it is
    # always checked together with them
    dirs = rulefile.rule_dirs([*(a.rules or ()), *(a.dirs or ())])
    rs = rulefile.load(dirs, check_egglog=a.action == "check")
    if a.action == "check":
        print(f"ok: {len(rs.rules)} graph rules in phases {', '.join(rs.phases) or '(none)'}, "
              f"{len(rs.egg_forms)} egglog forms, {len(rs.files)} files")
        extra = [str(d) for d in dirs[1:]]
        print(f"checked: the shipped rules ({rulefile.SHIPPED})" + (" together with " + ", ".join(extra) if extra else ""))
        from .rewrite.rulelint import warnings as rule_warnings
        for w in rule_warnings(rs, str(rulefile.SHIPPED)):
            print(w)
        return 0
    for r in rs.rules:
        off = " (disabled)" if r.name in rs.disabled else ""
        print(printable(f"{r.name:32s} {r.phase:12s} {r.at}{off}  {r.doc}"))  # text from the rule files
    return 0


def cmd_trace(a) -> int:
    from . import api, options, trace, tracefile, viewer
    from .schedule import schedule
    from .rewrite.engine import LoweringError
    if a.kernel.endswith(tracefile.SUFFIX):  # a saved trace: ask it, do not lower again
        if a.save or any(getattr(a, k) is not None for k in ("stages", "prefetch", "war", "shape", "stop_after",
                                                             "stop_after_phase", "rules")):
            raise CliError(f"{a.kernel} is a saved trace: lowering options (--stages, --rules, --save ...) do not "
                           "apply to it")
        t, name, effective = tracefile.load(a.kernel)
        kg = trace.final_graph(t)
    else:
        spec = load_spec(a)
        built = kernel_of(a, spec)
        try:
            kg = api.lower(built, rules=rule_folders(a) or None, debug=True, stop_after=a.stop_after,
                           stop_after_phase=a.stop_after_phase)
        except LoweringError as e:
            if a.html and e.trace is not None:  # the steps up to the failure are what one wants to see
                _write(a.html, viewer.page(e.trace, f"// lowering failed: {e}", f"cbrules trace {spec.name}: "
                                           f"{len(e.trace.records)} steps, then {type(e).__name__}"))
                print(f"wrote {a.html}: the {len(e.trace.records)} steps before lowering failed")
            raise
        t, name, effective = kg.trace, spec.name, options.describe(kg, built.graph)
        if a.save:
            tracefile.save(t, a.save, name, effective)
            print(f"saved the trace to {a.save}: ask it with `cbrules trace {a.save} QUERY ...`")
            if a.query is None and not a.html:
                return 0
    if a.html:
        from .codegen.cuda import emit
        cuda = emit(schedule(kg), annotate=True).text if t.complete else "// lowering stopped early: no CUDA"
        _write(a.html, viewer.page(t, cuda, f"cbrules trace {name}: {len(t.records)} steps",
                                   cuda_at=lambda g: emit(schedule(g)).text))  # the CUDA after each step
        print(f"wrote {a.html}: {len(t.records)} steps; open it in a browser")
        if a.query is None:
            return 0
    if a.query is None:
        raise CliError("trace needs a query (counts, log, history, why-not, graph, dot, cuda), --html FILE or "
                       "--save FILE")
    answer = _trace_query(a, t, kg)
    if a.query == "log" and not answer:  # as grep does: exit 1, and say so rather than print an empty line
        asked = ", ".join(f"{k} {v}" for k, v in (("rule", a.rule), ("phase", a.phase), ("node", a.node))
                          if v is not None)
        if a.json:
            print(json.dumps({"query": a.query, "options": dict(options.effective(kg)), "answer": []}))
        _error(f"nothing matched: no rule application with {asked or 'any rule'} among the trace's "
               f"{len(t.records)} records (`cbrules trace {name} counts` lists the rules that fired)")
        return 1
    if a.json:
        print(json.dumps({"query": a.query, "options": dict(options.effective(kg)), "answer": answer}, indent=1,
                         default=str))
    elif a.query == "dot" and a.output:
        _write(a.output, answer)
    else:
        if a.query not in ("dot", "cuda"):  # those two are meant for other programs
            print(effective)
        print(answer if isinstance(answer, str) else "\n".join(answer))
    return 0


def _trace_query(a, t, kg):
    """The answer of one trace query: text, or lines (both plain data for --json)."""
    from . import trace
    from .schedule import schedule
    q = a.query
    if q == "counts":
        rows = trace.counts(t)
        if a.json:
            return [{"rule": name, "applications": n, "seconds": secs} for name, n, secs in rows]
        return [f"{name:32s} {n:5d} {secs * 1e3:9.2f} ms" for name, n, secs in rows]
    if q == "log":
        recs = trace.select(t, a.rule, a.phase, a.node)
        return [dataclasses.asdict(r) for r in recs] if a.json else [trace.describe(r) for r in recs]
    if q == "history":
        _need(a, "node")
        return trace.history(t, a.node)
    if q == "why-not":
        _need(a, "rule")  # without --node: why the rule never fired in its phase (the closest candidate)
        w = trace.why_not(t, a.rule, a.node, a.step, getattr(a, "as_var", None))
        return dataclasses.asdict(w) if a.json else str(w)
    if q == "graph":
        at = a.step if a.step is not None else max(t.graphs, default=0)
        return "\n".join([trace.program_at(t, at), *trace.edges_at(t, at)])  # the edges labelled by kind
    if q == "dot":
        _need(a, "step")
        return trace.to_dot(t, a.step)
    from .codegen.cuda import emit
    return emit(schedule(kg), annotate=True).text


def _write(path: str, text: str) -> None:
    try:  # never blocks: a FIFO (which nobody may read) is refused
        write_text(path, text, "an output")
    except OSError as e:
        raise CliError(f"cannot write {printable(path)}: {e.strerror or e}") from None
    except ValueError as e:  # e.g. a NUL byte in the path
        raise CliError(f"cannot write {path!r}: {e}") from None


def _need(a, *names: str) -> None:
    missing = [n for n in names if getattr(a, n) is None]
    if missing:
        raise CliError(f"trace {a.query} needs " + " and ".join(f"--{n}" for n in missing))


def cmd_compile(a) -> int:
    spec = load_spec(a)
    kernel = kernel_of(a, spec)
    ck, summary = compile_kernel(spec, kernel, annotate=a.annotate, **lowering_options(a))
    if a.ptx:
        from . import api
        text = api.ptx(kernel, annotate=a.annotate, **lowering_options(a))
    else:
        text = ck.source.text
    if a.output:
        _write(a.output, text)
    elif not a.quiet:
        print(text)
    print(summary, file=sys.stderr)  # stdout holds only the source: `cbrules compile K > k.cu` is clean
    return 0


def cmd_run(a) -> int:
    from .codegen import runtime
    spec = load_spec(a)
    kernel = kernel_of(a, spec)
    if spec.inputs is None or spec.reference is None:
        raise CliError(f"{spec.name}: the kernel file defines no inputs()/reference(), so it cannot be run")
    ck, summary = compile_kernel(spec, kernel, **lowering_options(a))
    print(summary, file=sys.stderr)
    if not runtime.gpu_available():  # not a wrong command line (exit 2): the machine lacks the GPU (exit 1)
        from .codegen.errors import NoGpuError
        raise NoGpuError("no compute-capability 9.x GPU here: `cbrules run` needs a Hopper GPU "
                         "(`cbrules compile` and `cbrules check` work without one)")
    return 0 if run_kernel(spec, ck, shape_of(a, spec), a.reps, dtype=dtype_of(a, spec)) else 1


def cmd_tune(a) -> int:
    """Measure a built-in kernel's declared configurations at --shape on the GPU, print the table and
    keep the choice in the tuning cache (cbrules/autotune.py)."""
    import functools

    import numpy as np

    from .autotune import autotune
    from .codegen import runtime
    from .codegen.runtime import DeviceArray
    from .kernels.tuned import TUNED_KERNELS, tune_build, tune_space
    spec = load_spec(a)
    if spec.name not in TUNED_KERNELS or spec.inputs is None:
        raise CliError(f"{spec.name}: tune measures the declared configurations of {', '.join(TUNED_KERNELS)}")
    if not runtime.gpu_available():
        from .codegen.errors import NoGpuError
        raise NoGpuError("no compute-capability 9.x GPU here: `cbrules tune` measures on a Hopper GPU")
    dtype = dtype_of(a, spec)
    shape = shape_of(a, spec)
    args = {k: DeviceArray.from_numpy(v) if isinstance(v, np.ndarray) else v
            for k, v in spec.make_inputs(shape, np.random.default_rng(0), dtype).items()}
    build = functools.partial(tune_build, spec.factory, dtype)
    name = f"{spec.name}:" + ",".join(f"{k}={v}" for k, v in sorted(_variant_args(a).items()))
    choice = autotune(name, build, tune_space(spec.name, runtime.device_info()["sm_count"]),
                      {"shape": list(shape), "dtype": dtype}, args, workers=a.workers, cache=not a.no_cache)
    print(choice.table())
    print(f"chosen for {spec.name} at {','.join(map(str, shape))} {dtype}: "
          + (" ".join(f"{k}={v}" for k, v in choice.config.items()) or "the defaults")
          + (" (from the tuning cache)" if choice.cached else ""))
    return 0


def _variant_args(a) -> dict:
    from .cli_kernel import VARIANT_OPTIONS
    return {k: getattr(a, k) for k in VARIANT_OPTIONS if getattr(a, k, None) is not None}


def cmd_demo(a) -> int:
    from .codegen import runtime
    from .kernels import get
    spec = get("single_dim")
    kernel = spec.build(stages=option_schema.default("stages"))
    ck, summary = compile_kernel(spec, kernel, annotate=a.annotate)
    if not a.quiet:
        print(ck.source.text.split("// cbrules prelude")[0] + ck.source.text[ck.source.text.index('extern "C"'):])
    print(summary)
    if not runtime.gpu_available():
        print("no compute-capability 9.x GPU found: compiled for sm_90a, not run")
        return 0
    info = runtime.device_info()
    print(f"running on {info['name']}")
    return 0 if run_kernel(spec, ck, (a.size,), a.reps) else 1


def _count(least: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``least``."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < least:
            raise argparse.ArgumentTypeError(f"{v} is too small: give an integer >= {least}")
        return v
    parse.__name__ = f"integer >= {least}"
    return parse


def _int_or_auto(text: str):
    """An option with :auto in the schema (--stages, --prefetch): an integer, or auto (chosen by the rules)."""
    if text == option_schema.AUTO:
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither an integer nor {option_schema.AUTO}") from None


def _circular_buffer_options(p: argparse.ArgumentParser) -> None:
    """A flag for each option of the options schema that has one (rules/options.rules: its :flag, :help,
    :choices; an int with :auto also takes auto, a bool is a switch)."""
    for opt in option_schema.options().values():
        if opt.flag is None:
            continue
        kind = {"int": {"type": _int_or_auto if opt.auto else int}, "bool": {"action": "store_true"},
                "word": {"choices": list(opt.choices)}, "pair": {"metavar": opt.metavar or "A,B"},
                "count": {"type": int}}[opt.type]
        p.add_argument(opt.flag, help=opt.help_text, **kind)


def _kernel_options(p: argparse.ArgumentParser, check: bool = False) -> None:
    if check:  # the CPU checker needs a built-in kernel's small shapes per trip count, and picks them itself
        p.add_argument("kernel", help="a built-in circular-buffered kernel name (see `cbrules kernels`) or a Python "
                       "file defining build(), inputs(shape, rng), reference(inputs) and OUTPUTS")
    else:
        p.add_argument("kernel", help="a built-in kernel name (see `cbrules kernels`) or a Python file defining "
                       "build() (trace: also a saved FILE.cbtrace)")
    _circular_buffer_options(p)
    if check:
        p.add_argument("--shape", help="one case at this problem shape, e.g. 3,1000, instead of the small shapes "
                       "of trip counts 0..4S")
    else:
        p.add_argument("--shape", help="problem shape, e.g. 1048576 or 500,1024 (also picks build-time sizes)")
    p.add_argument("--dtype", choices=["float32", *STORAGE_DTYPES], help="type of the kernel's tensors (default "
                   "float32, or the kernel's first: bfloat16 for matmul_tc; float16/bfloat16/float8 are stored as such "
                   "and computed in float32; float8_e4m3/float8_e5m2: matmul_tc's operands, c in bfloat16)")
    p.add_argument("--tma-store", action="store_true", help="write each output tile with one TMA store from a "
                   "shared staging buffer (kernels whose output leaves in whole tiles)")
    p.add_argument("--swizzle", choices=["none", "32B", "64B", "128B"], help="shared-memory layout of the input "
                   "tiles (default none; swizzled boxes are one span wide, reads use the XOR address)")
    _variant_options(p)
    p.add_argument("--pingpong", action="store_true", help="matmul_tc: persistent and warp-specialized, 128x128 "
                   "tiles on two consumer warp groups that take turns on the tensor cores (one's epilogue under the "
                   "other's MMAs); implies --warp-specialize (check: one block walks every tile)")
    p.add_argument("--persistent", type=int, metavar="N", help="attention: N blocks (one an SM: 132 on an H200) "
                   "walk the query tiles, the producer loading each tile's Q too; non-causal, with --warp-specialize")


def _variant_options(p: argparse.ArgumentParser) -> None:
    """A built-in kernel's own parameters, which pick the kernel a command works on (tune takes them too:
    the configurations it measures are the rest)."""
    p.add_argument("--epilogue", metavar="NAME", help="matmul_tc: what the epilogue computes on the accumulator "
                   "before the store: none, bias, bias_relu, bias_gelu, bias_gelu_tanh, bias_silu, residual, "
                   "alpha_beta (docs/fragments.md)")
    p.add_argument("--scaling", choices=["none", "tensor", "rowcol", "block"], help="matmul_tc: the operands' "
                   "scales applied to the product: tensor (float32 scalars scale_a, scale_b; the FP8 default), rowcol "
                   "(float32 vectors scale_a[M], scale_b[N]), block (FP8: scale_a[M, K/128] a 1x128 run of A, "
                   "scale_b[N/128, K/128] a 128x128 block of B) or none (the default otherwise)")
    p.add_argument("--b-layout", choices=["nk", "kn"], help="matmul_tc: B given as [N, K] (nk, the default: "
                   "c = a @ b^T) or as [K, N] row-major (kn: c = a @ b, read MN-major through the transpose bit)")
    p.add_argument("--head-dim", type=int, metavar="D", help="attention: the head dimension D (64, 128 or 256; default 64)")
    p.add_argument("--causal", action="store_true", default=None, help="attention: causal (key <= query, top-left "
                   "aligned as torch's is_causal): only the key tiles up to each query tile's last row are walked")
    p.add_argument("--lse", action="store_true", default=None, help="attention: also write the log-sum-exp of each "
                   "query row (float32 [BH, Lq])")
    p.add_argument("--scale", type=float, metavar="X", help="attention: the softmax scale (default 1/sqrt(D))")


def _rule_options(p: argparse.ArgumentParser, debug: bool = False) -> None:
    p.add_argument("--rules", action="append", metavar="DIR", help="add a rule folder (repeatable; also "
                   f"${rulefile.ENV_VAR})")
    if debug:  # one meaning wherever it appears: list the rule applications (`trace` queries them)
        p.add_argument("--debug", action="store_true", help=DEBUG_HELP)


DEBUG_HELP = "record every rule application and print them after the program (also CBRULES_DEBUG=1)"


def parser() -> argparse.ArgumentParser:
    """The command line: one sub-parser per command (docs/cli.md's command table lists the same)."""
    p = argparse.ArgumentParser(prog="cbrules", description="Declarative rules that turn GPU kernels into "
                                "TMA circular-buffered Hopper kernels.", epilog=EXIT_CODES)
    p.add_argument("--version", action="version", version=f"cbrules {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="build, print, compile and (on a Hopper GPU) run the default kernel")
    d.add_argument("--size", type=_count(1), default=1 << 26, help="elements (default 2**26)")
    d.add_argument("--reps", type=_count(1), default=50, help="timed launches (default 50)")
    d.add_argument("--quiet", action="store_true", help="do not print the CUDA source")
    d.add_argument("--annotate", action="store_true", help="mark each statement with what produced it")
    d.set_defaults(fn=cmd_demo)
    sub.add_parser("kernels", help="list the built-in kernels").set_defaults(fn=cmd_kernels)
    sub.add_parser("ops", help="the node ops rules match and build: attributes, which hold terms, what each "
                   "does").set_defaults(fn=cmd_ops)
    sub.add_parser("options", help="the circular-buffer options (rules/options.rules): values, bounds, defaults, "
                   "flags and the named refusals of each").set_defaults(fn=cmd_options)
    lo = sub.add_parser("lower", help="print the lowered kernel as a linear program")
    _kernel_options(lo)
    _rule_options(lo, debug=True)
    lo.set_defaults(fn=cmd_lower)
    ru = sub.add_parser("rules", help="check or list the rule files")
    ru.add_argument("action", choices=["check", "list"], help="check: read and check only; list: every rule")
    ru.add_argument("dirs", nargs="*", help="rule folders or files, checked together with the shipped rules, "
                    "$CBRULES_RULES and --rules")
    ru.add_argument("--rules", action="append", metavar="DIR", help="add a rule folder (repeatable)")
    ru.set_defaults(fn=cmd_rules)
    tr = sub.add_parser("trace", help="lower in debug mode and query which rule did what")
    _kernel_options(tr)
    tr.add_argument("query", nargs="?", choices=["counts", "log", "history", "why-not", "graph", "dot", "cuda"],
                    help="counts: applications and time per rule; log: applications (filter with --rule GLOB, "
                    "--phase, --node); history: how --node came to be; why-not: why --rule did not fire on "
                    "--node; graph: the program after --step; dot: before/after picture of --step; cuda: "
                    "CUDA annotated with the rule behind each statement")
    tr.add_argument("--rule", help="rule name (glob for log)")
    tr.add_argument("--phase", help="only this phase (log)")
    tr.add_argument("--node", type=_count(0), help="node id")
    tr.add_argument("--step", type=_count(0), help="step number")
    tr.add_argument("--stop-after", type=_count(1), help="stop lowering after this step")
    tr.add_argument("--stop-after-phase", metavar="PHASE", help="stop lowering once this phase is done")
    tr.add_argument("--as", dest="as_var", metavar="?VAR", help="why-not: bind --node to this pattern variable")
    tr.add_argument("--json", action="store_true", help="print the answer as JSON")
    tr.add_argument("--save", metavar="FILE.cbtrace", help="save the trace; later queries name the file "
                    "instead of KERNEL and do not lower again")
    tr.add_argument("--html", metavar="FILE", help="write a self-contained page to step through the lowering: "
                    "steps, the graph before/after each as SVG, the CUDA linked to nodes and rules")
    tr.add_argument("-o", "--output", help="write the DOT here (dot)")
    tr.add_argument("--rules", action="append", metavar="DIR", help="add a rule folder (repeatable)")
    tr.set_defaults(fn=cmd_trace)
    c = sub.add_parser("compile", help="print the CUDA source and NVRTC-compile it for sm_90a")
    _kernel_options(c)
    _rule_options(c)
    c.add_argument("--annotate", action="store_true", help="mark each statement with what produced it")
    c.add_argument("--ptx", action="store_true", help="print NVRTC's PTX (compute_90a) instead of the CUDA source")
    c.add_argument("-o", "--output", help="write the CUDA source (or with --ptx the PTX) to this file instead of "
                   "stdout")
    c.add_argument("--quiet", action="store_true", help="print only the resource summary")
    c.set_defaults(fn=cmd_compile)
    r = sub.add_parser("run", help="compile, run on the GPU and compare with numpy")
    _kernel_options(r)
    _rule_options(r)
    r.add_argument("--reps", type=_count(1), default=20, help="timed launches (default 20)")
    r.set_defaults(fn=cmd_run)
    tu = sub.add_parser("tune", help="measure a tensor-core kernel's declared configurations at --shape on the GPU "
                        "and keep the fastest (the tuning cache)")
    tu.add_argument("kernel", help="matmul_tc or attention")
    tu.add_argument("--shape", help="problem shape, e.g. 4096,4096,4096 (matmul_tc: M,N,K; attention: BH,Lq,Lk)")
    tu.add_argument("--dtype", choices=["float32", *STORAGE_DTYPES], help="type of the kernel's tensors")
    _variant_options(tu)
    tu.add_argument("--workers", type=_count(1), default=None, help="compile in this many processes (default: "
                    "the CPU count, at most 8)")
    tu.add_argument("--no-cache", action="store_true", help="neither read nor write the tuning cache")
    tu.set_defaults(fn=cmd_tune)
    about = ("lower, then interpret on the CPU for trip counts 0..4*S with the barrier protocol checked, "
             f"comparing with the kernel before lowering and with numpy (S <= {MAX_CHECK_STAGES}: a larger --stages "
             "is refused before any work)")
    ch = sub.add_parser("check", help=about, description=about)
    _kernel_options(ch, check=True)
    _rule_options(ch)
    ch.add_argument("--sample", action="store_true", help="run only the first, middle and last block of each grid")
    ch.set_defaults(fn=cmd_check)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the console script; returns the exit code (see ``EXIT_CODES``)."""
    with warnings.catch_warnings(), _lost_interrupts() as interrupted, cli_output.guarded_stdout():
        warnings.showwarning = _show_warning
        try:
            args = parser().parse_args(argv)
            command = getattr(args, "command", None)
            with _native_interrupts(command), \
                    (progress_lines(command) if command in _LOWERING else contextlib.nullcontext()):
                code = args.fn(args)
            sys.stdout.flush()  # here, so that a closed pipe is reported by the handler below
            return 130 if interrupted else code
        except SystemExit as e:  # argparse: --help (0) or a usage error (2), already printed
            return e.code if isinstance(e.code, int) else 2
        except KeyboardInterrupt:
            return 130
        except BrokenPipeError:
            _silence_stdout()  # the reader (e.g. `head`) left: stop quietly
            return 141
        except cli_output.OutputError as e:
            _silence_stdout()  # what is still buffered must not fail again at exit
            _error(f"error: {cli_output.error_text(e)}")
            return e.code
        except CliError as e:
            _error(f"error: {cli_output.error_text(e)}")
            return 2
        except MemoryError:
            _error("error: out of memory (a smaller --shape or --size may fit)")
            return 1
        except Exception as e:
            if isinstance(e, CbrulesError):
                _error(f"{type(e).__name__}: {cli_output.error_text(e)}")
                return 1
            if os.environ.get(TRACEBACK_VAR, "") not in ("", "0"):
                raise
            _error(f"internal error: {type(e).__name__}: {cli_output.error_text(e)} -- this is a bug in cbrules; "
                   f"rerun with {TRACEBACK_VAR}=1 to see the traceback, and report it")
            return 3


# the commands that lower a kernel, so may spend long in one egglog run
_LOWERING = ("demo", "lower", "trace", "compile", "run", "check")


@contextlib.contextmanager
def _native_interrupts(command: Optional[str]) -> Iterator[None]:
    """Ctrl-C inside an egglog run ends the process (egglog cannot be interrupted otherwise; a
    shell reports 130, as for any other interrupt of this command); off again afterwards, for a
    caller that runs ``main`` in-process."""
    if command not in _LOWERING:
        yield
        return
    from .rewrite import egg
    egg.interrupt_ends_process(True)
    try:
        yield
    finally:
        egg.interrupt_ends_process(False)


def _error(text: str) -> None:
    cli_output.to_stderr(f"cbrules: {text}")


@contextlib.contextmanager
def _lost_interrupts() -> Iterator[list]:
    """Ctrl-C that lands in a finalizer (a ``__del__`` run by the collector or by a native library
    freeing its objects) is printed by Python as "Exception ignored" and lost, so the command would
    run to its end and exit 0. Such an interrupt is kept here, quietly, and the exit code is 130.
    (Raising it again from the hook, or from a timer thread, could land outside ``main`` in a caller
    that lowers in-process; the next Ctrl-C stops the command as usual.)"""
    lost: list = []
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            lost.append(unraisable)
        else:
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield lost
    finally:
        sys.unraisablehook = previous


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings (e.g. an egglog budget hit) as one line, without the source line that raised them."""
    _error(f"warning: {category.__name__}: {cli_output.error_text(message)}")


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # not a real file (e.g. captured by a test): nothing will be flushed to a closed pipe


if __name__ == "__main__":
    sys.exit(main())
