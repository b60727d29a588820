"""Hostile names, calls and values: each ends in a named error, and the generated CUDA of every
shipped kernel holds only validated identifiers (issue 10, "every name checked before it reaches CUDA")."""
import re

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st
from rulekit import write_rules

from cbrules.kernels import tuned
from cbrules import api
from cbrules.ir import names
from cbrules.rewrite import rulefile
from cbrules.ir.builder import BuildError, Kernel, circular_buffer, threadIdx
from cbrules.rewrite.engine import LoweringError
from cbrules.kernels import KERNELS
from cbrules.ir.names import IdentifierError, NameClashError
from cbrules.schedule import schedule
from cbrules.sexpr import RuleError
from cbrules.codegen.cuda import PRELUDE, PRELUDE_ROLES, emit
from cbrules.codegen.stats import STATS_PRELUDE

INJECTION = "N\n#define exp(x) 0\n"


def tiny(sym="N", loop="i", tensor="x", buf="s", reg="r") -> Kernel:
    """A kernel giving a name to each kind of thing: symbol, tensor, buffer, loop, register."""
    k = Kernel("tiny", block=32)
    n = k.symbol(sym)
    x = k.tensor(tensor, (n,))
    s = k.alloc(buf, "shared", "float32", (32,))
    with k.loop(loop, n) as i:
        k.store(s, threadIdx.x, k.load(x, i, dst=reg))
    return k


# ------------------------------------------------------------------------------ builder names
def test_symbol_with_a_define_is_refused_at_the_call():
    with pytest.raises(IdentifierError) as e:
        tiny(sym=INJECTION)
    msg = str(e.value)
    assert msg.startswith(f"symbol({INJECTION!r}) at ") and "test_hostile_names.py:" in msg
    assert repr(INJECTION) in msg and "\n" not in msg  # the newline shows escaped
    assert "not a C identifier" in msg and "rename it" in msg


def test_loop_variable_may_not_shadow_a_symbol():
    with pytest.raises(NameClashError, match=r"loop\('N'\) at .*already names a symbol of kernel 'tiny'"):
        tiny(loop="N")


@pytest.mark.parametrize("kind", ["sym", "loop", "tensor", "buf", "reg"])
@pytest.mark.parametrize("bad, why", [
    ("int", "keyword"), ("while", "keyword"), ("__x", "reserved by C"), ("a__b", "reserved by C"),
    ("_Tile", "reserved by C"), ("cb_full_3", "prefix that cbrules keeps"), ("CbSum", "used by the generated"),
    ("cb_smem", "used by the generated"), ("threadIdx", "used by the generated"), ("expf", "used by the generated"),
    ("x" * 64, "more than 63"), ("", "not a C identifier"), ("1x", "not a C identifier"),
    ("x\u00e9", "not a C identifier"), ("x-y", "not a C identifier"), ("a\\", "not a C identifier"),
])
def test_invalid_names_are_refused_for_every_kind_of_thing(kind, bad, why):
    with pytest.raises(IdentifierError, match=re.escape(why)):
        tiny(**{kind: bad})


@pytest.mark.parametrize("first, second", [("sym", "tensor"), ("tensor", "buf"), ("buf", "reg"),
                                           ("reg", "loop"), ("sym", "buf")])
def test_one_name_names_one_thing(first, second):
    with pytest.raises(NameClashError, match="already names a"):
        tiny(**{first: "dup", second: "dup"})


def test_kernel_name_and_tensor_map_name_are_checked():
    with pytest.raises(IdentifierError, match="keyword"):
        Kernel("void")
    k = Kernel("k")
    x = k.tensor("x", (k.symbol("N"),))
    with pytest.raises(IdentifierError, match="not a C identifier"):
        k.tensor_map(x, box=(256,), mname="x map")
    k.tensor("k", (4,))  # the kernel's name is outside its body: C lets a parameter reuse it


def test_a_buffer_allocated_twice_is_refused():
    k = Kernel("k", block=32)
    k.alloc("s", "shared", "float32", (4,))
    with pytest.raises(NameClashError, match=r"alloc\('s'\).*already names a buffer"):
        k.alloc("s", "shared", "float32", (8,))


# ------------------------------------------------------------------------------ builder values
@pytest.mark.parametrize("shape, message", [((-4,), "at least 1"), ((0,), "at least 1"), ((2.5,), "must be an int"),
                                            ((True,), "must be an int"), ((), "at least one dimension")])
def test_alloc_shapes_are_positive_ints(shape, message):
    with pytest.raises(BuildError, match=message):
        Kernel("k").alloc("s", "shared", "float32", shape)


@pytest.mark.parametrize("options, message", [
    (dict(stages=2.5), "stages must be an int, got 2.5"), (dict(stages=True), "stages must be an int"),
    (dict(stages="3"), "stages must be an int"), (dict(stages=3, prefetch=1.0), "prefetch must be an int"),
    (dict(stages=3, war=1), "war must be"),
    (dict(stages=3, strict_trip_count="yes"), "strict_trip_count must be True or False"),
])
def test_circular_buffer_options_are_ints(options, message):
    with pytest.raises(BuildError, match=message):
        circular_buffer(**options)


def test_circular_buffer_ranges_stay_with_the_rules():
    assert circular_buffer(1, -7) == {"stages": 1, "prefetch": -7}  # the rules refuse it (and fill in war)


@pytest.mark.parametrize("build, message", [
    (lambda k: k.tensor("t", (0,)), "at least 1"),
    (lambda k: k.tensor("t", (4.5,)), "must be an int"),
    (lambda k: k.grid(-1), "at least 1"),
    (lambda k: k.loop("i", 2.5).__enter__(), "stop must be an int"),
    (lambda k: k.bar_sync(16, 64), "ids are 0..15"),
    (lambda k: k.bar_sync(1, 48), "multiple of 32"),
    (lambda k: k.mbarrier_init(k.alloc("b", "shared", "mbarrier", (1,)), 0, count=0), "at least 1"),
])
def test_builder_values(build, message):
    with pytest.raises(BuildError, match=message):
        build(Kernel("k", block=64))


@pytest.mark.parametrize("build", [
    lambda k: k.select(object(), 1.0, 2.0),
    lambda k: k.exp([1.0]),
    lambda k: k.assign({"a": 1}),
    lambda k: k.store(k.tensor("t", (4,)), 0, object()),
])
def test_values_that_are_no_terms_are_named(build):
    """Any value where a term is needed (an operand, an index, a stored value) that is no number, term
    or expression text: a named error that is still a TypeError, not a raw one."""
    from cbrules.ir.terms import TermTypeError
    with pytest.raises(TermTypeError, match="cannot make a term from"):
        build(Kernel("k", block=64))


@pytest.mark.parametrize("block", [0, (32, -1), 2.0, (2048,), (1, 1, 1, 1)])
def test_block_shape(block):
    with pytest.raises(BuildError):
        Kernel("k", block=block)


# ------------------------------------------------------------------------------ rule folders
def _rule(tmp_path, rewrite: str, match: str = "(for ?L :stop ?n)"):
    write_rules(tmp_path, f"""
        (graph-rule hostile
          :doc "tries to put text of its own into the kernel"
          :phase cb-normalize
          :match ({match})
          :rewrite ({rewrite}))
        """)
    return tmp_path


def _lower(folder):
    return api.generate(KERNELS["single_dim"].build(), rules=[folder])


@pytest.mark.parametrize("rewrite, message", [
    ('(set ?L :stop (call "atomicAdd((float*)0x1000, 1.0f)" ?n))', "not a device function a term may call"),
    ('(set ?L :stop (call "mni" ?n 1))', "did you mean 'min'"),
    ('(set ?L :stop (call "min" ?n))', "takes 2 argument(s), got 1"),
    ('(set ?L :stop (var "N; asm(\\"trap;\\")"))', "not a C identifier"),
    ('(set ?L :stop (var "cb_smem"))', "used by the generated CUDA"),
])
def test_literal_calls_and_names_are_refused_by_rules_check(tmp_path, rewrite, message):
    with pytest.raises(RuleError) as e:
        rulefile.load(rulefile.rule_dirs([_rule(tmp_path, rewrite)]))
    col = len("  :rewrite (") + rewrite.index('"') + 1  # the literal itself
    assert str(e.value).startswith(f"{tmp_path / 'test.rules'}:5:{col}: ")
    assert message in str(e.value)


@pytest.mark.parametrize("rewrite, message", [
    ('(set ?L :stop (call (str "atomicAdd((float*)0x1000, " "1.0f)") ?n))', "not a device function"),
    ('(set ?L :stop (var (str "N + *(int*)" "0x10")))', "not a C identifier"),
])
def test_computed_calls_and_names_are_refused_when_the_rule_runs(tmp_path, rewrite, message):
    folder = _rule(tmp_path, rewrite)
    rulefile.load(rulefile.rule_dirs([folder]))  # nothing literal to refuse at check time
    with pytest.raises(LoweringError) as e:
        _lower(folder)
    assert "rule hostile" in str(e.value) and "test.rules:5:" in str(e.value) and message in str(e.value)


def test_var_yields_only_bound_names(tmp_path):
    with pytest.raises(LoweringError, match=r"\[name-defined\].*'elsewhere'.*not a loop variable in scope"):
        _lower(_rule(tmp_path, '(set ?L :stop (var (str "else" "where")))'))


HOSTILE_SETS = [
    ('(alloc ?a :buf "tile")', '(set ?a :buf "tile[0]; asm(\\"trap;\\"); float* t")', "not a C identifier"),
    ('(exp ?e :dst ?d)', '(set ?e :dst "v0 = 0; } __global__ void f() {")', "not a C identifier"),
]


@pytest.mark.parametrize("match, rewrite, expected", HOSTILE_SETS)
def test_rules_cannot_set_hostile_names(tmp_path, match, rewrite, expected):
    """A literal name codegen could not print is refused when the rules load, at the literal; one
    the rule computes, by the action that sets it, at the rule's text."""
    with pytest.raises(RuleError) as e:
        _lower(_rule(tmp_path / "literal", rewrite, match))
    assert re.search(r"test\.rules:5:\d+: \w+ :\w+ is a name the CUDA uses: ", str(e.value)) and expected in str(e.value)
    computed = re.sub(r'(:\w+) (".*")\)$', r'\1 (str "" \2))', rewrite)
    assert computed != rewrite
    with pytest.raises(LoweringError) as e:
        _lower(_rule(tmp_path / "computed", computed, match))
    assert "rule hostile" in str(e.value) and "test.rules:" in str(e.value) and expected in str(e.value)


def test_rules_cannot_make_one_name_name_two_things(tmp_path):
    """A valid name that clashes is caught by verify after the phase, naming the node."""
    with pytest.raises(LoweringError) as e:
        _lower(_rule(tmp_path, '(set ?L :var "N")', '(for ?L :var "i")'))
    assert "after phase 'cb-normalize' the graph is invalid" in str(e.value)
    assert "[name-unique] #2 for(var=N)" in str(e.value)


def test_a_rule_file_path_with_a_newline_stays_in_its_comment(tmp_path):
    folder = tmp_path / "evil\n#define expf(x) 0\n"
    write_rules(folder, """
        (graph-rule mark-entry
          :doc "harmless; its origin (the file path) shows in annotations"
          :phase cb-normalize
          :match ((kernel ?K))
          :rewrite ((insert-at-entry ?K (syncthreads))))
        """)
    text = api.generate(KERNELS["single_dim"].build(), rules=[folder], annotate=True).text
    body = text[text.index('extern "C"'):]
    assert "// mark-entry @ " in body and "\\x0a#define expf(x) 0\\x0a" in body
    assert not any(line.lstrip().startswith("#") and "pragma unroll" not in line for line in body.splitlines())


# ------------------------------------------------------------------------------ the generated CUDA
_CODEGEN_WORDS = {"__global__", "__launch_bounds__", "__shared__", "__align__", "__grid_constant__", "__restrict__",
                  "__syncthreads", "__int_as_float", "pragma", "unroll", "C"}
_TOKEN = re.compile(r"0[xX][0-9a-fA-F]+u?|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?f?|[A-Za-z_]\w*(?:\.[xyz]\b)?")


def _kernel_names(kg) -> set[str]:
    """The names the (verified) lowered graph gives: kernel, parameters, buffers, registers, loops."""
    out = {kg.kernel()["name"]} | set(kg.params()) | set(kg.buffers())
    for n in kg.nodes():
        d = kg[n]
        if kg.op(n) == "for":
            out.add(d["var"])
        elif "dst" in d and kg.op(n) not in ("store", "tma_load"):
            out.add(d["dst"])
            if kg.op(n) == "block_stats":  # its second register
                out.add(d["dst_m2"])
    return out


def _unchecked_tokens(kg, text: str) -> set[str]:
    body = re.sub(r"//[^\n]*", "", text[text.index('extern "C"'):])
    allowed = names.C_KEYWORDS | names.GENERATED | set(names.BUILTINS) | _CODEGEN_WORDS | _kernel_names(kg)
    return {t for t in _TOKEN.findall(body) if not t[0].isdigit() and t not in allowed}


def _variants():
    for name, spec in KERNELS.items():
        yield name, spec.build
    for op in tuned.TILES:
        # sorted: a set's order differs per process, and parallel workers must collect the same tests
        chosen = {(tuned.tiles(op, s)[0], tuple(tuned.tiles(op, s)[1].items())) for s in tuned.shapes(op)}
        for kname, params in sorted(chosen, key=repr):
            for stages in (1, 3):
                yield f"bench-{op}-{kname}-{dict(params)}-S{stages}", \
                    lambda kname=kname, params=params, stages=stages: tuned.build_variant(kname, stages,
                                                                                          **dict(params))


@pytest.mark.parametrize("label, build", list(_variants()), ids=lambda v: v if isinstance(v, str) else "")
def test_generated_cuda_holds_only_validated_identifiers(label, build):
    kg = api.lower(build())
    text = emit(schedule(kg), annotate=True).text
    assert all(names.is_valid(nm, names.RULES) for nm in _kernel_names(kg))
    assert _unchecked_tokens(kg, text) == set()


def test_the_scan_would_see_an_unchecked_name():
    kg = api.lower(KERNELS["single_dim"].build())
    text = emit(schedule(kg)).text
    assert _unchecked_tokens(kg, text.replace("expf(", "sinf(")) == {"sinf"}


@pytest.mark.parametrize("prelude", [PRELUDE, PRELUDE_ROLES, STATS_PRELUDE], ids=["prelude", "prelude_roles",
                                                                             "prelude_stats"])
def test_every_prelude_definition_is_reserved(prelude):
    defined = set(re.findall(r"\b(?:struct|void|bool|unsigned|int|T)\s+(?:__align__\(\d+\)\s+)?([A-Za-z_]\w*)\s*[({]",
                             prelude)) - names.C_KEYWORDS
    assert defined and defined <= names.PRELUDE_NAMES, defined - names.PRELUDE_NAMES
    assert re.findall(r"\b(cb_\w+|Cb\w+|CB_\w+)", prelude) and \
        set(re.findall(r"\b(cb_\w+|Cb\w+|CB_\w+)", prelude)) <= names.PRELUDE_NAMES


# ------------------------------------------------------------------------------ any text as a name
_HOSTILE_TEXT = st.one_of(
    st.text(max_size=12),
    st.text(alphabet="aZ_09 \n\\;(){}#*\"'\u00e9", max_size=8),
    st.sampled_from(sorted(names.C_KEYWORDS | names.GENERATED) + ["cb_x", "CB_X", "CbX", "__a", "_A", "a" * 64]),
)


@seed(10)
@settings(max_examples=300, deadline=None)
@given(name=_HOSTILE_TEXT, kind=st.sampled_from(["sym", "loop", "tensor", "buf", "reg"]))
def test_any_text_is_refused_or_a_valid_identifier(name, kind):
    try:
        k = tiny(**{kind: name})
    except IdentifierError as e:
        assert repr(name) in str(e) and e.name == name
        return
    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", name), name
    assert name not in names.C_KEYWORDS | names.GENERATED and "__" not in name
    assert not re.match(r"_[A-Z]|cb_|CB_|Cb[A-Z]", name)
    text = emit(schedule(k.graph)).text  # the unlowered kernel is valid: codegen prints the name as a token
    assert re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", text[text.index('extern "C"'):])


# ------------------------------------------------------------------------------ NVRTC's own macros (issue 28)
NVRTC_MACRO_NAMES = ["NULL", "CUDART_VERSION", "assert", "va_start", "NV_IS_DEVICE", "NV_PROVIDES_SM_90",
                     "cudaStreamLegacy", "CUDA_IPC_HANDLE_SIZE", "CU_UUID_HAS_BEEN_DEFINED", "CUDARTAPI"]


@pytest.mark.parametrize("macro", NVRTC_MACRO_NAMES + ["__CUDACC__", "__CUDA_ARCH__", "__NVCC__", "_NV_X"])
def test_names_nvrtc_predefines_are_refused_at_the_builder(macro):
    with pytest.raises(IdentifierError, match="macro NVRTC defines|reserved by C"):
        tiny(sym=macro)
    assert names.problem(macro, names.RULES) is not None  # nor may a rule make one


def _macros_defined(candidates):
    """The names among ``candidates`` that NVRTC defines as macros when it compiles a kernel."""
    from cbrules.codegen import nvrtc
    found = set()
    for i in range(0, len(candidates), 40):  # a batch stays under NVRTC's error limit
        chunk = candidates[i:i + 40]
        src = "".join(f'#ifdef {n}\nstatic_assert(false, "MACRO:{n}");\n#endif\n' for n in chunk)
        _, log, _ = nvrtc._run_nvrtc(src + "__global__ void k() {}\n", "probe.cu",
                                     ["--gpu-architecture=sm_90a", "-std=c++17"])
        found |= set(re.findall(r"MACRO:(\w+)", log))
    return found


def test_every_macro_nvrtc_defines_is_a_reserved_name():
    """Probe the NVRTC installed here: every name its built-in headers #define that is defined in a
    kernel's compile must be refused as a name (the named ones above are macros indeed)."""
    import glob
    import nvidia
    assert _macros_defined(NVRTC_MACRO_NAMES) == set(NVRTC_MACRO_NAMES)
    libs = [p for d in nvidia.__path__ for p in glob.glob(f"{d}/**/libnvrtc-builtins*.so*", recursive=True)]
    if not libs:
        pytest.skip("no libnvrtc-builtins library found to read the macro names from")
    text = open(libs[0], "rb").read().decode("latin-1")
    candidates = sorted({n for n in re.findall(r"#\s*define\s+([A-Za-z_]\w*)", text)
                         if names.problem(n, names.RULES) is None})  # what the name check would let through
    assert not _macros_defined(candidates), "NVRTC defines names the name check accepts"
