"""Bad inputs get a clear error naming the argument, what was expected and what came."""
import pytest
import torch

import scankit

f = torch.randn


CASES = [
    # (call, exception, words the message must contain)
    (lambda: scankit.parallel_scan_log(f(2, 5), f(2, 6)), ValueError, ["log_coeffs", "3-D", "(2, 5)"]),
    (lambda: scankit.parallel_scan_log(f(2, 5, 3), f(2, 5, 3)), ValueError, ["log_values", "T+1", "(2, 6, 3)", "(2, 5, 3)"]),
    (lambda: scankit.parallel_scan_log(f(2, 5, 3), f(2, 6, 4)), ValueError, ["log_values", "(2, 6, 3)"]),
    (lambda: scankit.parallel_scan_log(f(2, 5, 3), f(2, 6, 3).double()), TypeError, ["log_values", "float32", "float64"]),
    (lambda: scankit.parallel_scan_log(f(2, 0, 3), f(2, 1, 3)), ValueError, ["log_coeffs", "T >= 1"]),
    (lambda: scankit.parallel_scan_log(torch.ones(2, 5, 3, dtype=torch.int64), f(2, 6, 3)), TypeError, ["log_coeffs", "int64"]),
    (lambda: scankit.parallel_scan_log([1.0], f(2, 6, 3)), TypeError, ["log_coeffs", "list"]),
    # log_h0 given: log_values is (B, T, D), log_h0 (B, D)
    (lambda: scankit.parallel_scan_log(f(2, 5, 3), f(2, 6, 3), log_h0=f(2, 3)), ValueError,
     ["log_values", "(2, 5, 3)", "(2, 6, 3)", "log_h0 is given"]),
    (lambda: scankit.parallel_scan_log(f(2, 5, 3), f(2, 5, 3), log_h0=f(2, 4)), ValueError, ["log_h0", "(2, 3)", "(2, 4)"]),
    (lambda: scankit.parallel_scan_log(f(2, 5, 3), f(2, 5, 3), log_h0=f(2, 1, 3)), ValueError, ["log_h0", "2-D", "(2, 1, 3)"]),
    (lambda: scankit.parallel_scan_log(f(2, 5, 3), f(2, 5, 3), log_h0=f(2, 3).double()), TypeError,
     ["log_h0", "float32", "float64"]),
    (lambda: scankit.parallel_scan_log(f(2, 5, 3), f(2, 5, 3), log_h0=1.0), TypeError, ["log_h0", "float"]),
    (lambda: scankit.parallel_scan_log(f(2, 5, 3), f(2, 5, 3)), ValueError, ["log_values", "T+1", "or pass log_h0="]),
    (lambda: scankit.linear_scan(f(2, 5, 3), f(2, 5, 3), return_final_state=1), TypeError,
     ["return_final_state", "True or False", "1"]),
    (lambda: scankit.linear_scan(f(2, 5, 3), f(2, 5, 4)), ValueError, ["b", "(2, 5, 3)", "(2, 5, 4)"]),
    (lambda: scankit.linear_scan(f(2, 5, 3), f(2, 5, 3).half()), TypeError, ["b", "float16"]),
    (lambda: scankit.linear_scan(f(2, 0, 3), f(2, 0, 3)), ValueError, ["a", "T >= 1"]),
    (lambda: scankit.matrix_scan(f(2, 0, 3, 2, 2), f(2, 0, 3, 2)), ValueError, ["M", "T >= 1"]),
    (lambda: scankit.linear_scan(f(2, 5, 3), f(2, 5, 3), h0=f(2, 4), return_prefix=False), ValueError, ["h0", "(2, 3)", "(2, 4)"]),
    (lambda: scankit.linear_scan(f(2, 5, 3), f(2, 5, 3), h0=f(2, 3).double(), return_prefix=False), TypeError, ["h0", "float64"]),
    (lambda: scankit.linear_scan(f(2, 5, 3), f(2, 5, 3), h0=f(2, 3)), ValueError, ["h0", "return_prefix=False", "A * h0 + Bc"]),
    (lambda: scankit.matrix_scan(f(2, 5, 3, 2, 2), f(2, 5, 3, 2), h0=f(2, 3, 2)), ValueError, ["h0", "return_prefix=False"]),
    (lambda: scankit.matrix_affine_scan(f(2, 5, 3, 4, 4), f(2, 5, 3, 4, 1), h0=f(2, 3, 4, 1)), ValueError, ["h0", "return_prefix=False"]),
    (lambda: scankit.linear_scan(torch.ones(2, 5, 3, dtype=torch.int32), torch.ones(2, 5, 3, dtype=torch.int32)), TypeError, ["a", "int32"]),
    (lambda: scankit.linear_scan(torch.ones(2, 5, 3, dtype=torch.complex64), f(2, 5, 3)), TypeError, ["a", "complex64"]),
    (lambda: scankit.matrix_scan(f(2, 5, 3, 3, 3), f(2, 5, 3, 2)), ValueError, ["M", "(B, T, n, 2, 2)"]),
    (lambda: scankit.matrix_scan(f(2, 5, 3, 2, 2), f(2, 5, 3, 3)), ValueError, ["b", "(2, 5, 3, 2)"]),
    (lambda: scankit.matrix_scan(f(2, 5, 3, 2, 2), f(2, 5, 3)), ValueError, ["b", "4-D"]),
    (lambda: scankit.matrix_affine_scan(f(2, 5, 3, 4, 3), f(2, 5, 3, 4, 1)), ValueError, ["A", "square"]),
    (lambda: scankit.matrix_affine_scan(f(2, 5, 3, 4, 4), f(2, 5, 3, 3, 1)), ValueError, ["B", "(2, 5, 3, 4)"]),
    (lambda: scankit.matrix_affine_scan(f(2, 5, 3, 4, 4), f(2, 5, 3, 4)), ValueError, ["B", "5-D"]),
    (lambda: scankit.matrix_affine_scan(f(2, 5, 3, 4, 4), f(2, 5, 3, 4, 2), h0=f(2, 3, 4), return_prefix=False), ValueError, ["h0", "4-D", "(B, n, k, v)", "(2, 3, 4)"]),
]


@pytest.mark.parametrize("call,exc,words", CASES)
def test_bad_input_message(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    for word in words:
        assert word in str(info.value), f"{word!r} missing from: {info.value}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device to mix devices")
def test_mixed_devices():
    with pytest.raises(ValueError, match="b must be on the device of a"):
        scankit.linear_scan(f(2, 5, 3), f(2, 5, 3, device="cuda"))


def test_mixer_bad_inputs():
    m = scankit.MinGRU(4, 6)
    with pytest.raises(ValueError, match=r"x must have shape \(B, T >= 1, input_size=4\); got \(2, 3, 5\)"):
        m(f(2, 3, 5))
    with pytest.raises(ValueError, match=r"h_0 must have shape \(B, hidden_size\) = \(2, 6\)"):
        m(f(2, 3, 4), h_0=torch.ones(2, 5))
    with pytest.raises(ValueError, match="h_0 must be > 0"):
        m(f(2, 3, 4), h_0=-torch.ones(2, 6))
    with pytest.raises(ValueError, match="decay=False"):
        m(f(2, 3, 4), delta_t=torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"delta_t must have shape \(B, T\) = \(2, 3\)"):
        scankit.MinGRU(4, 6, decay=True)(f(2, 3, 4), delta_t=torch.ones(2, 4))
    with pytest.raises(ValueError, match="x_t must have shape"):
        m.step(f(2, 3, 4))
    with pytest.raises(ValueError, match="even"):
        scankit.RotationMinGRU(4, 5)
    with pytest.raises(ValueError, match="multiple of the block size 8"):
        scankit.GivensMinGRU(4, 12)
    with pytest.raises(ValueError, match="block_size must be even"):
        scankit.GivensMinGRU(4, 12, block_size=3)
    with pytest.raises(ValueError, match="mixer must be one of"):
        scankit.MinGRUStack(8, 2, mixer="lstm")
    for depth in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match=rf"depth must be an int >= 1 \(the number of blocks\); got {depth!r}"):
            scankit.MinGRUStack(8, depth)
