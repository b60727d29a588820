"""The CPU model of the tensor cores: the wgmma matrix descriptor, the canonical operand layouts read
from bytes a TMA model wrote (every swizzle, K- and MN-major), the accumulator fragment, and one
m64nNk16 instruction against numpy -- with wrong descriptors giving wrong results."""
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

from cbrules.errors import CbrulesError
from cbrules.ir.mma_layout import (MMA_K, MMA_M, DescriptorError, FragmentError, MatrixDescriptor, MmaLayoutError,
                                   fragment_coords, fragment_slot, operand_address, tma_tile_descriptor)
from cbrules.reference.hazards import Site
from cbrules.reference.hwsim import read_box, swizzled
from cbrules.reference.interp_mma import MmaOperandError, as_bytes, fragments_to_matrix, wgmma

SPANS = (128, 64, 32, 0)
DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _site():
    return Site(0, "test TMA load", (0,))


def _place(smem: np.ndarray, start: int, src: np.ndarray, box_rows: int, span: int) -> int:
    """TMA-load ``src`` [box_rows, width] into ``smem`` (2-byte elements) at byte ``start`` the way the
    house's TMA model does: boxes [box_rows, span/2] (8 elements unswizzled), one after the other,
    each swizzled by :func:`cbrules.reference.hwsim.swizzled`. Returns the bytes written."""
    inner = (span or 16) // 2
    assert src.shape[1] % inner == 0 and src.shape[0] == box_rows, "whole boxes only"
    lo = start // 2
    for p in range(src.shape[1] // inner):
        data = read_box(src, (0, p * inner), (box_rows, inner))
        if span:
            data = swizzled(data, 2, span, lo, "smem", _site)
        smem[lo:lo + data.size] = data
        lo += data.size
    return src.size * 2


def _operand(rng, rows, cols, dtype):
    return rng.standard_normal((rows, cols)).astype(DTYPES[dtype])


def _run(smem, a_start, b_start, bk, n, span, dtype, b_major="k", a_major="k", **override):
    """Every k-step of a [64, bk] x [bk, n] tile through wgmma; ``override`` replaces descriptor fields."""
    acc = np.full((128, n // 2), np.nan, np.float32)  # poisoned: the first step must overwrite
    for ks in range(bk // MMA_K):
        da = tma_tile_descriptor(a_start, MMA_M if a_major == "k" else bk, span, a_major, ks)
        db = tma_tile_descriptor(b_start, n if b_major == "k" else bk, span, b_major, ks)
        if override:
            da, db = override.get("a", lambda d: d)(da), override.get("b", lambda d: d)(db)
        acc = wgmma(acc, smem, da.encode(), smem, db.encode(), n=n, dtype=dtype, scale_d=int(ks > 0),
                    trans_a=int(a_major == "mn"), trans_b=int(b_major == "mn"))
    return fragments_to_matrix(acc, n)


def _tile(rng, n, bk, span, dtype, a_major="k", b_major="k"):
    """(shared memory, A start, B start, A [64, bk], B [bk, n]) with both operands TMA-placed."""
    a = _operand(rng, MMA_M, bk, dtype)
    b = _operand(rng, bk, n, dtype)
    smem = np.zeros(MMA_M * bk + bk * n + 512, DTYPES[dtype])  # room for B on its 1024-byte repeat
    a_src = a if a_major == "k" else np.ascontiguousarray(a.T)  # K-major A is [M, K]; M-major is [K, M]
    b_src = np.ascontiguousarray(b.T) if b_major == "k" else b  # K-major B is [N, K]; N-major is [K, N]
    a_rows = MMA_M if a_major == "k" else bk
    b_rows = n if b_major == "k" else bk
    a_start = 0
    b_start = -(-(a_start + _place(smem, a_start, a_src, a_rows, span)) // 1024) * 1024
    _place(smem, b_start, b_src, b_rows, span)
    return smem, a_start, b_start, a, b


def _reference(a, b):
    return a.astype(np.float64) @ b.astype(np.float64)


# ----------------------------------------------------------------------------- descriptor


def test_descriptor_encoding_is_the_documented_bit_layout():
    d = MatrixDescriptor(start=0x4a0, lbo=16, sbo=1024, swizzle=128)
    assert d.encode() == (1 << 62) | (64 << 32) | (1 << 16) | (0x4a0 >> 4)
    assert MatrixDescriptor(0, 0, 0, 64).encode() == 2 << 62
    assert MatrixDescriptor(0, 0, 0, 32, base_offset=5).encode() == (3 << 62) | (5 << 49)
    rng = np.random.default_rng(0)
    for _ in range(200):
        span = int(rng.choice(SPANS))
        d = MatrixDescriptor(*(16 * int(x) for x in rng.integers(0, 1 << 14, 3)), swizzle=span,
                             base_offset=int(rng.integers(0, 8)) if span else 0)
        assert MatrixDescriptor.decode(d.encode()) == d
        assert d.encode() < 1 << 64


@pytest.mark.parametrize("fields, words", [
    (dict(start=8, lbo=16, sbo=1024), "start = 8 bytes"),
    (dict(start=1 << 18, lbo=16, sbo=1024), "start = 262144"),
    (dict(start=0, lbo=-16, sbo=1024), "lbo = -16"),
    (dict(start=0, lbo=16, sbo=1000), "sbo = 1000"),
    (dict(start=0, lbo=16, sbo=1024, swizzle=48), "swizzle = 48"),
    (dict(start=0, lbo=16, sbo=1024, swizzle=128, base_offset=8), "base offset = 8"),
    (dict(start=0, lbo=16, sbo=1024, base_offset=1), "without a swizzle"),
])
def test_descriptor_fields_out_of_range_are_named_errors(fields, words):
    with pytest.raises(DescriptorError, match=words) as e:
        MatrixDescriptor(**fields)
    assert isinstance(e.value, CbrulesError)


def test_decoding_refuses_bits_outside_the_fields():
    good = MatrixDescriptor(1024, 16, 1024, 128).encode()
    for stray in (14, 31, 46, 48, 52, 61):
        with pytest.raises(DescriptorError, match="outside its fields"):
            MatrixDescriptor.decode(good | 1 << stray)
    for bad in (-1, 1 << 64, 1.5, True):
        with pytest.raises(DescriptorError):
            MatrixDescriptor.decode(bad)


def test_tma_tile_descriptor_of_the_usual_k_major_128b_tile():
    """REFERENCE §7: SBO 1024, LBO the conventional encoded 1, +32 bytes (+2 in the field) a k-step;
    with BK = 128 the fifth k-step is the second box."""
    d0 = tma_tile_descriptor(2048, 128, 128, "k")
    assert (d0.start, d0.sbo, d0.lbo, d0.swizzle, d0.base_offset) == (2048, 1024, 16, 128, 0)
    assert (d0.encode() >> 16) & 0x3FFF == 1
    d1 = tma_tile_descriptor(2048, 128, 128, "k", 1)
    assert d1.start - d0.start == 32 and d1.encode() - d0.encode() == 2
    assert tma_tile_descriptor(2048, 128, 128, "k", 4).start == 2048 + 128 * 128
    # MN-major (B as [K, N], 64-wide panels of N): LBO steps to the next panel, SBO 8 K rows
    m = tma_tile_descriptor(0, 64, 128, "mn", 2)
    assert (m.start, m.lbo, m.sbo) == (2 * 16 * 128, 64 * 128, 1024)
    # unswizzled (PTX canonical layouts, "interleave"): 8-row x 16-byte core matrices; K-major LBO
    # steps along K, SBO along M/N; MN-major the roles trade: LBO 8 K rows, SBO the next 8 of M/N
    u = tma_tile_descriptor(0, 64, 0, "k", 1)
    assert (u.start, u.lbo, u.sbo) == (2 * 64 * 16, 64 * 16, 128)
    v = tma_tile_descriptor(0, 32, 0, "mn", 1)
    assert (v.start, v.lbo, v.sbo) == (16 * 16, 128, 32 * 16)


@pytest.mark.parametrize("call, words", [
    (lambda: tma_tile_descriptor(512, 64, 128, "k"), "1024-byte repeat"),
    (lambda: tma_tile_descriptor(0, 60, 128, "k"), "multiple of 8"),
    (lambda: tma_tile_descriptor(0, 8, 128, "mn"), "at least 16"),
    (lambda: tma_tile_descriptor(0, 64, 128, "mn", 4), "k-step 4 reads K rows 64..79"),
    (lambda: tma_tile_descriptor(0, 64, 96, "k"), "swizzle span 96"),
    (lambda: tma_tile_descriptor(0, 64, 128, "row"), "major-ness 'row'"),
    (lambda: operand_address(MatrixDescriptor(0, 16, 1024, 128, base_offset=2), 0, 0, "k"), "base offset 2"),
])
def test_tile_requests_that_cannot_work_are_named_errors(call, words):
    with pytest.raises(MmaLayoutError, match=words):
        call()


# ----------------------------------------------------------------------------- layouts from TMA bytes


@pytest.mark.parametrize("span", SPANS)
@pytest.mark.parametrize("major", ("k", "mn"))
def test_descriptor_addresses_find_every_element_where_the_tma_model_put_it(span, major):
    """Element ids TMA-placed (hwsim boxes + swizzle) and read back through the descriptor of each
    k-step: the canonical layout and the TMA layout agree element for element."""
    rows, bk = 128, 64  # a [128 x 64] K-major tile, or a [64 K x 128] MN-major one
    ids = np.arange(rows * bk, dtype=np.uint16).reshape(rows, bk)  # ids[mn, k]
    src = ids if major == "k" else np.ascontiguousarray(ids.T)
    smem = np.zeros(rows * bk + 512, np.uint16)
    start = 1024
    _place(smem, start, src, rows if major == "k" else bk, span)
    raw = as_bytes(smem)
    mn, k = np.meshgrid(np.arange(rows), np.arange(MMA_K), indexing="ij")
    for ks in range(bk // MMA_K):
        d = tma_tile_descriptor(start, rows if major == "k" else bk, span, major, ks)
        addr = operand_address(MatrixDescriptor.decode(d.encode()), mn, k, major)
        got = raw[addr].astype(np.uint16) | raw[addr + 1].astype(np.uint16) << 8
        np.testing.assert_array_equal(got, ids[:, ks * MMA_K:(ks + 1) * MMA_K])


# ----------------------------------------------------------------------------- the instruction


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("span", SPANS)
@pytest.mark.parametrize("n", (8, 64, 256))
def test_wgmma_k_major_equals_numpy(dtype, span, n):
    rng = np.random.default_rng(n + span)
    smem, a0, b0, a, b = _tile(rng, n, 64, span, dtype)
    np.testing.assert_allclose(_run(smem, a0, b0, 64, n, span, dtype), _reference(a, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("span", SPANS)
@pytest.mark.parametrize("a_major, b_major", (("k", "mn"), ("mn", "k"), ("mn", "mn")))
def test_wgmma_mn_major_operands_through_the_transpose_bits(span, a_major, b_major):
    rng = np.random.default_rng(span)
    n, bk = 128, 64
    smem, a0, b0, a, b = _tile(rng, n, bk, span, "bfloat16", a_major, b_major)
    got = _run(smem, a0, b0, bk, n, span, "bfloat16", b_major=b_major, a_major=a_major)
    np.testing.assert_allclose(got, _reference(a, b), rtol=1e-5, atol=1e-5)


def test_scale_d_overwrites_or_accumulates_and_the_scales_negate():
    rng = np.random.default_rng(7)
    smem, a0, b0, a, b = _tile(rng, 16, 16, 32, "float16")
    da, db = tma_tile_descriptor(a0, 64, 32, "k").encode(), tma_tile_descriptor(b0, 16, 32, "k").encode()
    ones = np.ones((128, 8), np.float32)
    ab = _reference(a, b)
    run = lambda **kw: fragments_to_matrix(wgmma(ones, smem, da, smem, db, n=16, dtype="float16", **kw), 16)  # noqa
    np.testing.assert_allclose(run(scale_d=0), ab, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(run(scale_d=1), ab + 1, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(run(scale_d=1, scale_a=-1), 1 - ab, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(run(scale_d=0, scale_a=-1, scale_b=-1), ab, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("wrong", [
    dict(a=lambda d: replace(d, lbo=d.sbo, sbo=d.lbo)),  # SBO and LBO swapped
    dict(b=lambda d: replace(d, lbo=d.sbo, sbo=d.lbo)),
    dict(a=lambda d: replace(d, swizzle=64), b=lambda d: replace(d, swizzle=64)),  # the wrong swizzle mode
    dict(a=lambda d: replace(d, swizzle=0)),
    dict(b=lambda d: replace(d, swizzle=32)),
    dict(a=lambda d: d.advanced(16)),  # start off by 16 bytes
    dict(b=lambda d: d.advanced(16)),
    dict(b=lambda d: d.advanced(-16) if d.start % 1024 else d.advanced(128)),
], ids=["A-sbo-lbo-swapped", "B-sbo-lbo-swapped", "swizzle-64B", "A-unswizzled", "B-swizzle-32B",
        "A-start+16", "B-start+16", "B-start-16"])
def test_a_wrong_descriptor_field_gives_a_wrong_result(wrong):
    """The model reads the bytes: each mistake the GPU would punish changes the product."""
    rng = np.random.default_rng(3)
    smem, a0, b0, a, b = _tile(rng, 128, 64, 128, "bfloat16")
    right = _run(smem, a0, b0, 64, 128, 128, "bfloat16")
    np.testing.assert_allclose(right, _reference(a, b), rtol=1e-5, atol=1e-5)
    try:
        got = _run(smem, a0, b0, 64, 128, 128, "bfloat16", **wrong)
    except MmaOperandError:  # read outside shared memory: also caught
        return
    bad = ~np.isclose(got, _reference(a, b), rtol=1e-3, atol=1e-3)
    assert bad.mean() > 0.2, f"only {bad.mean():.0%} of the tile changed"


def test_operand_reads_outside_shared_memory_and_bad_arguments_are_named_errors():
    smem = np.zeros(4096, np.uint16)  # 8 KiB
    acc = np.zeros((128, 32), np.float32)
    da = MatrixDescriptor(0, 16, 1024, 128).encode()
    far = MatrixDescriptor(8192 - 1024, 16, 1024, 128).encode()
    with pytest.raises(MmaOperandError, match=r"reads B element .* outside the 8192 bytes"):
        wgmma(acc, smem, da, smem, far, n=64, dtype="bfloat16", scale_d=0)
    for kw, words in ((dict(dtype="float32"), "input dtype 'float32'"), (dict(scale_d=2), "scale-d = 2"),
                      (dict(scale_a=0), "imm-scale-a = 0"), (dict(trans_b=2), "transpose immediate 2"),
                      (dict(n=60), "N = 60"), (dict(n=32), r"float32 \[128, 16\]")):
        args = dict(n=64, dtype="bfloat16", scale_d=0) | kw
        with pytest.raises(MmaLayoutError, match=words):
            wgmma(acc, smem, da, smem, da, **args)


def test_fp16_inputs_are_read_as_fp16_not_bf16():
    rng = np.random.default_rng(11)
    smem, a0, b0, a, b = _tile(rng, 64, 32, 64, "float16")
    np.testing.assert_allclose(_run(smem, a0, b0, 32, 64, 64, "float16"), _reference(a, b), rtol=1e-5, atol=1e-5)
    wrong = _run(smem, a0, b0, 32, 64, 64, "bfloat16")  # the same bytes as bf16: garbage, never equal
    assert not np.allclose(wrong, _reference(a, b), rtol=1e-2, atol=1e-2, equal_nan=False)


# ----------------------------------------------------------------------------- fragments


@pytest.mark.parametrize("n", (8, 24, 128, 256))
def test_fragment_coords_are_a_bijection_onto_the_tile_and_slot_inverts_them(n):
    t, r = np.meshgrid(np.arange(128), np.arange(n // 2), indexing="ij")
    row, col = fragment_coords(t, r, n)
    flat = row * n + col
    assert sorted(flat.ravel()) == list(range(64 * n))
    back_t, back_r = fragment_slot(row, col, n)
    np.testing.assert_array_equal(back_t, t)
    np.testing.assert_array_equal(back_r, r)


def test_fragment_coords_match_the_documented_examples():
    """REFERENCE §7: d[4c..4c+3] of lane l of warp w hold rows 16w + l/4 (+8 for the last two),
    columns 8c + 2(l%4) + {0, 1}."""
    cases = {(0, 0): (0, 0), (0, 1): (0, 1), (0, 2): (8, 0), (0, 3): (8, 1), (0, 4): (0, 8),
             (1, 0): (0, 2), (3, 1): (0, 7), (4, 0): (1, 0), (31, 3): (15, 7), (32, 0): (16, 0),
             (127, 127): (63, 255)}
    for (t, r), rc in cases.items():
        assert tuple(int(x) for x in fragment_coords(t, r, 256)) == rc
        assert tuple(int(x) for x in fragment_slot(*rc, 256)) == (t, r)


@pytest.mark.parametrize("call, words", [
    (lambda: fragment_coords(128, 0, 64), "thread 128"),
    (lambda: fragment_coords(0, 32, 64), "register of an m64n64 accumulator 32"),
    (lambda: fragment_slot(64, 0, 64), "accumulator row 64"),
    (lambda: fragment_slot(0, -1, 64), "column of an m64n64 accumulator -1"),
    (lambda: fragment_coords(0, 0, 264), "N = 264"),
    (lambda: fragment_coords(0, 0, 12), "N = 12"),
])
def test_fragment_requests_out_of_range_are_named_errors(call, words):
    with pytest.raises(FragmentError, match=words):
        call()
