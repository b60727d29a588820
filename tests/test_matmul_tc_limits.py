"""matmul_tc requests the compiler cannot build are refused by name before NVRTC (registers), and
output widths the kernel picks itself work (bn=96)."""
import pytest

from cbrules import api
from cbrules.kernels.matmul_tc import MatmulTileError, matmul_tc, register_limit, store_cols


@pytest.mark.parametrize("params, fixes", [
    (dict(bm=256, bn=256, groups=4), ["bn <= 200"]),                          # 128 registers a thread
    (dict(bm=192, bn=256, groups=3, warp_specialize=True), ["bn <= 200"]),    # 3 consumers + the producer
    (dict(bm=256, bn=256, groups=4, warp_specialize=True), ["bn <= 136"]),    # 96 registers a thread
    (dict(bm=128, bn=256, groups=1), ["bn <= 208", "groups=2"]),              # two blocks of 128 floats
])
def test_accumulators_past_the_registers_are_refused_with_what_fits(params, fixes):
    with pytest.raises(MatmulTileError) as e:
        matmul_tc(stages=2, **params)
    msg = str(e.value)
    assert "Insufficient registers" in msg and "a thread gets" in msg, msg
    for fix in fixes:
        assert fix in msg, msg


@pytest.mark.parametrize("params", [
    dict(), dict(warp_specialize=True), dict(warp_specialize=True, registers=(40, 232)),
    dict(bm=192, bn=256, groups=3), dict(bm=256, bn=192, groups=4), dict(bm=128, bn=208, groups=1),
    dict(bm=256, bn=200, groups=4),
])
def test_tiles_that_compiled_on_nvrtc_are_accepted(params):
    """Each of these compiled with NVRTC 13 without spilling (the calibration of the refusal)."""
    matmul_tc(stages=2, **params)


def test_register_limit():
    assert register_limit(256) == 255 and register_limit(384) == 168 and register_limit(512) == 128
    assert register_limit(640) == 96 and register_limit(384, 232) == 232


@pytest.mark.parametrize("bn, out_dtype, cols", [
    (256, "bfloat16", 64), (128, "bfloat16", 64), (48, "bfloat16", 48), (96, "bfloat16", 32), (160, "bfloat16", 32),
    (96, "float32", 32), (40, "float32", 8), (200, "bfloat16", 40),
])
def test_the_output_box_divides_the_tile(bn, out_dtype, cols):
    assert store_cols(bn, out_dtype) == cols and bn % cols == 0


def test_bn_96_builds_and_compiles(tmp_path):
    """bn=96 was refused with a box the caller cannot choose; now the kernel stores it in 32-column boxes."""
    k = matmul_tc(stages=3, bn=96)
    ck = api.compile(k, cache_dir=str(tmp_path))
    assert ck.cubin.resources.spill_stores == 0
