"""Rows TMA cannot load (a row stride that is not a multiple of 16 bytes): the launch is refused with
the padding that works, which then runs."""
import ml_dtypes
import numpy as np
import pytest

from cbrules import api
from cbrules.ir.limits import TmaLimitError, check_tensor_map
from cbrules.kernels import get
from cbrules.reference.interp import run


def test_the_error_names_the_padding_that_works_and_the_padding_runs():
    kg = api.lower(get("inner_reduction").build(stages=3))
    x = np.random.default_rng(0).standard_normal((3, 150), dtype=np.float32)
    with pytest.raises(TmaLimitError) as e:
        run(kg, {"x": x, "out": np.zeros(3, np.float32)})
    msg = str(e.value)
    assert "stride of axis 0 is 600 bytes" in msg
    assert "pad the innermost extent from 150 to 152 elements (rows of 608 bytes" in msg
    assert "np.pad(x, ((0, 0), (0, 2)))" in msg and "0 for a sum" in msg
    padded = np.pad(x, ((0, 0), (0, 2)))  # as the message says: zeros add nothing to a sum
    got = run(kg, {"x": padded, "out": np.zeros(3, np.float32)})["out"]
    np.testing.assert_allclose(got, x.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape, itemsize, padded", [((7, 5, 13), 4, 16), ((4, 9), 2, 16), ((4, 3), 8, 4),
                                                     ((2, 17), 2, 24)])
def test_the_padding_is_to_whole_16_byte_rows(shape, itemsize, padded):
    strides = tuple(itemsize * int(np.prod(shape[a + 1:])) for a in range(len(shape)))
    with pytest.raises(TmaLimitError, match=f"from {shape[-1]} to {padded} elements"):
        check_tensor_map("m", shape, strides, itemsize, 0, (1,) * (len(shape) - 1) + (16 // itemsize * 2,))
    padded_shape = shape[:-1] + (padded,)
    strides = tuple(itemsize * int(np.prod(padded_shape[a + 1:])) for a in range(len(shape)))
    check_tensor_map("m", padded_shape, strides, itemsize, 0, (1,) * (len(shape) - 1) + (16 // itemsize * 2,))


def test_a_half_precision_row_is_padded_in_its_own_elements():
    kg = api.lower(get("inner_reduction").build(stages=2, dtype="bfloat16"))
    x = np.zeros((2, 300), ml_dtypes.bfloat16)
    with pytest.raises(TmaLimitError, match="from 300 to 304 elements"):
        run(kg, {"x": x, "out": np.zeros(2, ml_dtypes.bfloat16)})
