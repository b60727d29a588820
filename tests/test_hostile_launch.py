"""Hostile launch values (issue 10): every case ends in a named error (LaunchError, TmaLimitError), on
the CPU (the compile cache's hostile cases: tests/test_hostile_cache.py).

Launch checks must run before any driver call: the ``no_driver`` fixture makes every device entry
point fail loudly, and the fake arrays below point at addresses no one may dereference.
"""
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from cbrules import api
from cbrules.ir.bind import LaunchError, bind, bind_symbols, launch_grid
from cbrules.ir.graph import Param
from cbrules.kernels import KERNELS
from cbrules.ir.limits import TmaLimitError
from cbrules.ir.terms import parse
from cbrules.ir.builder import Kernel, threadIdx
from cbrules.codegen import runtime



M, N = 8, 512  # multi_dim: out = exp(x), x TMA-loaded with box (4, 256); 2 tiles >= stages=2
FAKE_PTR = 0x7F00_0000_0000  # 256-byte aligned, never dereferenced


@pytest.fixture(scope="module")
def multi_dim(tmp_path_factory):
    kernel = KERNELS["multi_dim"].build(stages=2)
    return kernel, api.compile(kernel, cache_dir=str(tmp_path_factory.mktemp("cache")))


@pytest.fixture
def no_driver(monkeypatch):
    """Any driver use (context, allocation, module load) fails the test."""
    def reached(*_a, **_k):
        raise AssertionError("a launch check reached the CUDA driver")
    monkeypatch.setattr(runtime, "current_context", reached)


class FakeCai:
    """A device array as torch or cupy describe one (``__cuda_array_interface__`` version 3)."""

    def __init__(self, shape, typestr="<f4", strides=None, ptr=FAKE_PTR, readonly=False, **extra):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "strides": strides,
                                         "data": (ptr, readonly), "version": 3, **extra}


def good_args(**over):
    return {"x": FakeCai((M, N)), "out": FakeCai((M, N), ptr=FAKE_PTR + 0x10_0000), **over}


def refused(ck, match, **over):
    with pytest.raises(LaunchError, match=match) as info:
        ck.bind(**good_args(**over))
    assert str(info.value).startswith("multi_dim: "), info.value
    return str(info.value)


# ------------------------------------------------------------------------------ symbol bindings

BAD_SYMBOLS = [4096.7, 512.0, np.float32(512), np.float64(512), True, np.bool_(True), "512", None,
               Decimal(512), Fraction(512), 1 + 0j, [512]]


@pytest.mark.parametrize("value", BAD_SYMBOLS, ids=repr)
def test_non_integer_symbol_is_refused_by_the_launcher(multi_dim, no_driver, value):
    _, ck = multi_dim
    msg = refused(ck, "symbol N = ", N=value)
    assert repr(value) in msg and "integer" in msg and "never rounded" in msg, msg


@pytest.mark.parametrize("value", BAD_SYMBOLS, ids=repr)
def test_non_integer_symbol_is_refused_by_the_interpreter(multi_dim, value):
    kernel, _ = multi_dim
    args = {"x": np.zeros((M, N), np.float32), "out": np.zeros((M, N), np.float32)}
    with pytest.raises(LaunchError, match=f"multi_dim: symbol N = .*{type(value).__name__}"):
        bind(kernel.graph, args, {"N": value})


@pytest.mark.parametrize("value", [2**31, -2**31 - 1, 10**30])
def test_symbol_outside_int32_is_refused(multi_dim, no_driver, value):
    _, ck = multi_dim
    refused(ck, f"symbol M = {value} does not fit the kernel's 32-bit int", M=value)


@pytest.mark.parametrize("value", [N, np.int64(N), np.int32(N), np.uint16(N), np.array(N)], ids=repr)
def test_integer_symbols_are_accepted(multi_dim, no_driver, value):
    kernel, ck = multi_dim
    _, symbols, grid = ck.check(**good_args(N=value))
    assert symbols == {"M": M, "N": N} and type(symbols["N"]) is int and grid == (M // 4, 1, 1)
    args = {"x": np.zeros((M, N), np.float32), "out": np.zeros((M, N), np.float32)}
    assert bind(kernel.graph, args, {"N": value}).symbols == {"M": M, "N": N}


def test_symbol_disagreeing_with_a_shape_is_refused(multi_dim, no_driver):
    _, ck = multi_dim
    refused(ck, r"'x' dimension 1 is 512, but N = 768", N=768)


def test_interpreter_refuses_unknown_symbols(multi_dim):
    kernel, _ = multi_dim
    args = {"x": np.zeros((M, N), np.float32), "out": np.zeros((M, N), np.float32)}
    with pytest.raises(LaunchError, match="unknown symbol.*K; the kernel's symbols are M, N"):
        bind(kernel.graph, args, {"K": 3})


def test_a_zero_divisor_from_a_symbol_is_a_launch_error():
    params = [Param("N", "symbol"), Param("K", "symbol"),
              Param("y", "tensor", "float32", (parse("N"),)), Param("x", "tensor", "float32", (parse("N / K"),))]
    with pytest.raises(LaunchError, match=r"k: cannot evaluate tensor 'x' dimension 0 N / K for K=0, N=8"):
        bind_symbols("k", params, (), {"y": (8,), "x": (2,)}, {"K": 0})
    assert bind_symbols("k", params, (), {"y": (8,), "x": (2,)}, {"K": 4}) == {"N": 8, "K": 4}


@pytest.mark.parametrize("grid, symbols, match", [
    ("N", {"N": -1}, r"grid x = N = -1 is outside 0\.\.2147483647"),
    ("N", {"N": 2**31 - 1}, None),
    ("1, N", {"N": 65536}, r"grid y = N = 65536 is outside 0\.\.65535"),
    ("1, 1, N", {"N": 65536}, r"grid z = N = 65536"),
    ("1, 1, N", {"N": 0}, None),
])
def test_grid_limits(grid, symbols, match):
    terms = [parse(t) for t in grid.split(", ")] + [parse("1")] * (3 - grid.count(",") - 1)
    if match is None:
        assert launch_grid("k", terms, symbols) == tuple(int(t.value) if t.op == "const" else symbols["N"]
                                                          for t in terms)
    else:
        with pytest.raises(LaunchError, match=match):
            launch_grid("k", terms, symbols)


# ------------------------------------------------------------------------- borrowed device arrays

def test_contiguous_borrowed_arrays_pass_every_check(multi_dim, no_driver):
    _, ck = multi_dim
    tensors, symbols, grid = ck.check(**good_args())
    assert tensors["x"].ptr == FAKE_PTR and not tensors["x"].owned and symbols == {"M": M, "N": N}
    with pytest.raises(AssertionError, match="reached the CUDA driver"):  # checks pass: on to the device
        ck.bind(**good_args())


@pytest.mark.parametrize("arg", ["x", "out"])
def test_strided_borrowed_array_is_refused(multi_dim, no_driver, arg):
    _, ck = multi_dim
    strided = FakeCai((M, N), strides=(2 * N * 4, 4))  # every other row of a (2M, N) array
    msg = refused(ck, f"tensor '{arg}' .* is a strided view", **{arg: strided})
    assert f"shape ({M}, {N}), strides ({2 * N * 4}, 4) bytes" in msg and ".contiguous()" in msg, msg


@pytest.mark.parametrize("arg", ["x", "out"])
def test_reversed_borrowed_array_is_refused(multi_dim, no_driver, arg):
    _, ck = multi_dim
    flipped = FakeCai((M, N), strides=(-N * 4, 4), ptr=FAKE_PTR + (M - 1) * N * 4)  # x[::-1]
    msg = refused(ck, f"tensor '{arg}' .* is a reversed \\(negative strides\\) view", **{arg: flipped})
    assert f"strides ({-N * 4}, 4) bytes" in msg and ".contiguous()" in msg, msg


def test_transposed_borrowed_array_is_refused(multi_dim, no_driver):
    _, ck = multi_dim
    transposed = FakeCai((M, N), strides=(4, M * 4))  # out.T of an (N, M) array
    refused(ck, r"'out' \(shape \(8, 512\), strides \(4, 32\) bytes.* strided view", out=transposed)


def test_misaligned_dense_array_is_refused(multi_dim, no_driver):
    _, ck = multi_dim
    msg = refused(ck, "'out' .* is not aligned to its 4-byte elements", out=FakeCai((M, N), ptr=FAKE_PTR + 2))
    assert f"address {FAKE_PTR + 2:#x}" in msg and "clone()" in msg, msg


def test_misaligned_tma_tensor_is_refused(multi_dim, no_driver):
    """x is TMA-loaded: its base must be 16-byte aligned (element alignment is not enough)."""
    _, ck = multi_dim
    with pytest.raises(TmaLimitError, match=r"'x_tmap': global address is 0x7f0000000004.*16-byte"):
        ck.bind(**good_args(x=FakeCai((M, N), ptr=FAKE_PTR + 4)))


def test_tma_row_pitch_not_a_multiple_of_16_is_refused(multi_dim, no_driver):
    _, ck = multi_dim
    n = 258  # 1032-byte rows; still two tiles of 256
    with pytest.raises(TmaLimitError, match="'x_tmap': stride of axis 0 is 1032 bytes"):
        ck.bind(x=FakeCai((M, n)), out=FakeCai((M, n), ptr=FAKE_PTR + 0x10_0000))
    with pytest.raises(TmaLimitError, match="'x_tmap': stride of axis 0 is 1032 bytes"):  # numpy too, before any copy
        ck.bind(x=np.zeros((M, n), np.float32), out=np.zeros((M, n), np.float32))


def test_null_pointer_is_refused(multi_dim, no_driver):
    _, ck = multi_dim
    refused(ck, "'out' .* NULL data pointer", out=FakeCai((M, N), ptr=0))


def test_read_only_output_is_refused(multi_dim, no_driver):
    _, ck = multi_dim
    refused(ck, "'out' .* read-only by its producer", out=FakeCai((M, N), ptr=FAKE_PTR + 0x10_0000, readonly=True))
    ck.check(**good_args(x=FakeCai((M, N), readonly=True)))  # a read-only input is fine
    x, out = np.zeros((M, N), np.float32), np.zeros((M, N), np.float32)
    out.flags.writeable = False
    with pytest.raises(LaunchError, match="'out' is a read-only numpy array"):
        ck.bind(x=x, out=out)


@pytest.mark.parametrize("shape, match", [
    ((M, 0), "'x' dimension 1 is 0"),
    ((0, N), "'x' dimension 0 is 0"),
    ((-4, N), "'x' dimension 0 is -4"),
    ((M,), "'x' has rank 1, the kernel expects 2"),
    ((1, M, N), "'x' has rank 3"),
])
def test_bad_extents_are_refused(multi_dim, no_driver, shape, match):
    _, ck = multi_dim
    refused(ck, match, x=FakeCai(shape))
    if min(shape) >= 0:  # the interpreter and numpy inputs: the same words
        kernel, _ = multi_dim
        args = {"x": np.zeros(shape, np.float32), "out": np.zeros((M, N), np.float32)}
        with pytest.raises(LaunchError, match=match):
            bind(kernel.graph, args)
        with pytest.raises(LaunchError, match=match):
            ck.bind(**args)


@pytest.mark.parametrize("typestr", ["<f8", "<i4", "|b1", "<f2"])
def test_wrong_dtype_is_refused(multi_dim, no_driver, typestr):
    _, ck = multi_dim
    refused(ck, f"tensor 'x' is {np.dtype(typestr)}, the kernel expects float32", x=FakeCai((M, N), typestr))


@pytest.mark.parametrize("value, match", [
    ([[1.0] * N] * M, "'x' cannot be used .*cannot make a DeviceArray from list"),
    (None, "'x' cannot be used"),
    ("x", "'x' cannot be used"),
    (FakeCai((M, N), typestr="not a dtype"), "malformed __cuda_array_interface__"),
    (FakeCai((M, 512.5)), "malformed __cuda_array_interface__"),
    (FakeCai((M, N), strides=(4,)), "1 strides for shape"),
    (FakeCai((M, N), mask=object()), "masked"),
    (FakeCai((M, N), ptr=-16), "pointer -16 is negative"),
])
def test_malformed_arrays_are_refused(multi_dim, no_driver, value, match):
    _, ck = multi_dim
    refused(ck, match, x=value)


def test_malformed_interface_dicts_are_refused(multi_dim, no_driver):
    _, ck = multi_dim
    for cai in ({"shape": (M, N)}, {"shape": (M, N), "typestr": "<f4", "data": 5}, "a string"):
        fake = FakeCai((M, N))
        fake.__cuda_array_interface__ = cai
        refused(ck, "'x' cannot be used", x=fake)


def test_interpreter_refuses_what_numpy_cannot_read(multi_dim):
    kernel, _ = multi_dim
    out = np.zeros((M, N), np.float32)
    with pytest.raises(LaunchError, match="'x' is a list numpy cannot read"):
        bind(kernel.graph, {"x": [[1.0], [1.0, 2.0]], "out": out})
    with pytest.raises(LaunchError, match="'x' is <U1, the kernel expects float32"):
        bind(kernel.graph, {"x": "x", "out": out})


def test_strided_numpy_arrays_are_copied_not_refused(multi_dim, no_driver):
    """numpy inputs are copied to the device anyway, so their layout does not matter."""
    _, ck = multi_dim
    x = np.zeros((M, 2 * N), np.float32)[:, ::2]
    tensors, symbols, _ = ck.check(x=x, out=np.zeros((N, M), np.float32).T)
    assert tensors["x"] is x and symbols == {"M": M, "N": N}


_hostile_value = st.one_of(
    st.integers(-2**40, 2**40), st.sampled_from([M, N]), st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(), st.none(), st.text(max_size=8), st.binary(max_size=8), st.lists(st.integers(), max_size=3))
_extent = st.one_of(st.sampled_from([M, N]), st.integers(-2, 2**33), st.floats(-2, 600))


@st.composite
def hostile_arrays(draw):
    """A ``__cuda_array_interface__`` with any field possibly wrong: shape, dtype, strides, address."""
    shape = tuple(draw(st.lists(_extent, min_size=0, max_size=3)))
    strides = draw(st.one_of(st.none(), st.lists(st.integers(-2**20, 2**20), max_size=3).map(tuple)))
    typestr = draw(st.sampled_from(["<f4", "<f4", "<f8", "<i4", "|u1", "garbage", ""]))
    ptr = draw(st.one_of(st.just(FAKE_PTR), st.integers(-1, 2**64), st.just(0)))
    return FakeCai(shape, typestr, strides, ptr, readonly=draw(st.booleans()))


@seed(20261130)
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(hostile_arrays(), _hostile_value), st.one_of(hostile_arrays(), _hostile_value),
       st.dictionaries(st.sampled_from(["M", "N", "K", "x_tmap"]), _hostile_value, max_size=2))
def test_hostile_launch_arguments_end_in_a_named_error_before_the_driver(multi_dim, x, out, symbols):
    """Anything at all as arguments: the launch checks pass or refuse with a named error, and never
    reach the driver (``no_driver`` is not usable with @given, so the check is :meth:`check`)."""
    _, ck = multi_dim
    try:
        tensors, bound, grid = ck.check(x=x, out=out, **symbols)
    except (LaunchError, TmaLimitError) as e:
        assert str(e).startswith(("multi_dim: ", "tensor map 'x_tmap'")), e
        return
    for name, value in {"x": x, "out": out}.items():  # accepted: only well-formed dense arrays
        arr = tensors[name]
        assert arr.shape == (bound["M"], bound["N"]) and arr.is_contiguous and arr.ptr % 16 == 0, (name, arr)
        assert arr.dtype == np.float32 and not (name == "out" and arr.readonly)
    assert grid == (-(-bound["M"] // 4), 1, 1) and bound["N"] > 256


# ------------------------------------------------------------------------------ issue 28: sizes a machine cannot hold
@pytest.mark.parametrize("value, match", [
    (FakeCai((2 ** 32, 2 ** 32)), r"holds 18446744073709551616 elements of 4 bytes, more than a signed 64-bit"),
    (FakeCai((2 ** 31 - 1, 2 ** 31 - 1)), r"more than a signed 64-bit byte count"),
    (FakeCai((M, N), ptr=2 ** 64 + 16), r"data pointer 0x10000000000000010 is not a 64-bit address"),
    (FakeCai((True, N)), r"shape \(True, 512\) holds a bool, not an extent"),
    (FakeCai((M, N), ptr=2 ** 64 - 256), r"reaches past the end of the 64-bit address space"),
])
def test_borrowed_arrays_a_64_bit_machine_cannot_hold_are_refused(multi_dim, no_driver, value, match):
    _, ck = multi_dim
    refused(ck, match, x=value)


def test_a_scalar_beyond_any_double_is_a_launch_error():
    k = Kernel("scaled", block=32)
    n = k.symbol("N")
    eps = k.scalar("eps")
    x, out = k.tensor("x", (n,)), k.tensor("out", (n,))
    k.grid(1)
    k.store(out, threadIdx.x, k.add(k.load(x, threadIdx.x), eps))
    args = {"x": np.zeros(32, np.float32), "out": np.zeros(32, np.float32)}
    for value in (10 ** 400, -10 ** 5000):
        with pytest.raises(LaunchError, match=r"scalar eps \(float32\) = an integer of \d+ bits is too large"):
            bind(k.graph, {**args, "eps": value})
    with pytest.raises(LaunchError, match="symbol N = an integer of 1329 bits does not fit"):
        bind(k.graph, {**args, "N": 10 ** 400})
