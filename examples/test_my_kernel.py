"""How a kernel's own pytest suite adopts the oracle, in the style of FlashAttention's
tests/test_flash_attn.py: parametrize over shapes, dtypes and options, run the kernel under
test, and assert it matches attention's float64 reference within the tolerance rule that
FlashAttention's own tests use (2x, 3x for gradients, the error of a plain implementation in
the same dtype). Like FlashAttention's suite, it takes the 16-bit dtypes, where the storage
rounding dominates: in float32 the yardstick's error is its summation order's, which moves
with the BLAS (OpenBLAS's SkylakeX kernels sum an M = 1 product far more accurately than its
Haswell ones), so a float32 verdict depends on the machine as much as on the kernel.

    pip install . ml_dtypes pytest      # from the repository's root
    pytest examples/test_my_kernel.py

`my_kernel` is a stand-in (flashattn's own tiled forward and backward); put yours there. With
PyTorch, pass torch tensors (CPU or CUDA) the same way: the check copies candidates on a GPU
to the host for the reference.
"""
import numpy as np
import pytest

import flashattn
from flashattn.testing import assert_attention_close

try:
    import ml_dtypes
    DTYPES = [np.float16, ml_dtypes.bfloat16]
except ImportError:
    DTYPES = [np.float16]


def my_kernel(q, k, v, dout, *, causal, window):
    """The kernel under test: returns out, lse and the gradients for dout."""
    out, lse = flashattn.attention(q, k, v, causal=causal, window=window, return_lse=True)
    dq, dk, dv = flashattn.attention_backward(dout, q, k, v, out, lse, causal=causal,
                                              window=window)
    return out, lse, dq, dk, dv


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [None, (32, 0)])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(1, 239), (113, 203), (128, 128), (256, 512)])
@pytest.mark.parametrize("hq, hk", [(4, 4), (8, 2)])
def test_forward_and_backward(dtype, causal, window, seqlen_q, seqlen_k, hq, hk):
    if window is not None and not causal:
        pytest.skip("a window here goes with causal")
    rng = np.random.default_rng(0)
    d = 64
    q = rng.standard_normal((2, seqlen_q, hq, d)).astype(dtype)
    k = rng.standard_normal((2, seqlen_k, hk, d)).astype(dtype)
    v = rng.standard_normal((2, seqlen_k, hk, d)).astype(dtype)
    dout = rng.standard_normal((2, seqlen_q, hq, d)).astype(dtype)
    out, lse, dq, dk, dv = my_kernel(q, k, v, dout, causal=causal, window=window)
    assert_attention_close(q, k, v, out=out, lse=lse, dout=dout, dq=dq, dk=dk, dv=dv,
                           causal=causal, window=window)
