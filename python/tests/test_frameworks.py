"""Arrays of PyTorch and JAX (and CuPy on a GPU) through DLPack: results in the caller's
framework, the same values as numpy's; on a GPU, the CUDA backend and the oracle against
PyTorch SDPA's kernels. Each framework's tests skip where it is not installed."""
import numpy as np
import pytest

import flashattn as fa



def _import(name):
    try:
        return __import__(name)
    except ImportError:
        return None


TORCH = _import("torch")
JAX = _import("jax")
CUDA = TORCH is not None and TORCH.cuda.is_available()


def qkv(seed=0, b=2, sq=33, sk=47, hq=4, hk=2, d=32):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((b, sq, hq, d)).astype(np.float32),
            rng.standard_normal((b, sk, hk, d)).astype(np.float32),
            rng.standard_normal((b, sk, hk, d)).astype(np.float32))


# ------------------------------------------------------------------ JAX


@pytest.mark.skipif(JAX is None, reason="needs jax")
def test_jax_arrays_in_and_out():
    import jax.numpy as jnp
    q, k, v = qkv(1)
    want, want_lse = fa.attention(q, k, v, causal=True, return_lse=True)
    out, lse = fa.attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), causal=True,
                            return_lse=True)
    assert isinstance(out, JAX.Array) and isinstance(lse, JAX.Array)
    assert np.array_equal(np.asarray(out), want) and np.array_equal(np.asarray(lse), want_lse)
    assert fa.check(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), out=out, causal=True)


@pytest.mark.skipif(JAX is None, reason="needs jax")
def test_jax_bfloat16_and_gradients():
    import jax.numpy as jnp
    q, k, v = (jnp.asarray(x, dtype=jnp.bfloat16) for x in qkv(2))
    out, lse = fa.attention(q, k, v, return_lse=True)
    assert out.dtype == jnp.bfloat16
    dout = jnp.ones_like(out)
    dq, dk, dv = fa.attention_backward(dout, q, k, v, out, lse)
    assert dq.dtype == jnp.bfloat16
    assert fa.check(q, k, v, out=out, dout=dout, dq=dq, dk=dk, dv=dv)


@pytest.mark.skipif(JAX is None, reason="needs jax")
def test_jax_arrays_are_immutable_outputs():
    import jax.numpy as jnp
    q, k, v = (jnp.asarray(x) for x in qkv(3))
    with pytest.raises(TypeError, match="immutable"):
        fa.attention(q, k, v, out=jnp.zeros_like(q))


# ------------------------------------------------------------------ PyTorch, CPU


@pytest.mark.skipif(TORCH is None, reason="needs torch")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_torch_cpu_tensors(dtype):
    t = TORCH
    q, k, v = (t.from_numpy(x).to(getattr(t, dtype)) for x in qkv(4))
    out = fa.attention(q, k, v, causal=True)
    assert fa._api.last_call["q"].data == q.data_ptr()  # read in place
    assert isinstance(out, t.Tensor) and out.dtype == q.dtype
    want = fa.attention(*(x.float().numpy() for x in (q, k, v)), causal=True)
    tol = {"float32": 1e-6, "bfloat16": 2e-2, "float16": 2e-3}[dtype]
    assert np.abs(out.float().numpy() - want).max() < tol
    assert fa.check(q, k, v, out=out, causal=True)


@pytest.mark.skipif(TORCH is None, reason="needs torch")
def test_torch_tensors_that_require_grad():
    t = TORCH
    q, k, v = (t.from_numpy(x).requires_grad_() for x in qkv(7))
    out = fa.attention(q, k, v)  # read through a detached view, no copy
    assert not out.requires_grad
    with pytest.raises(fa.InvalidArgumentError, match="requires grad"):
        fa.attention(q, k, v, out=t.zeros_like(q, requires_grad=True))


@pytest.mark.skipif(TORCH is None, reason="needs torch")
def test_torch_sdpa_math_is_checked_in_bhsd():
    t = TORCH
    q, k, v = (t.from_numpy(x).transpose(1, 2) for x in qkv(5, hk=4))  # (B, H, S, D)
    out = t.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    r = fa.check(q, k, v, out=out, causal=True, layout="bhsd", profile="pytorch")
    assert r, str(r)
    assert not fa.check(q, k, v, out=out, causal=True, layout="bhsd")  # bottom-right


# ------------------------------------------------------------------ PyTorch, CUDA


SDPA_BACKENDS = ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"]


def _sdpa(backend, q, k, v, **kw):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(getattr(SDPBackend, backend)):
        return TORCH.nn.functional.scaled_dot_product_attention(q, k, v, **kw)


@pytest.mark.skipif(not CUDA, reason="needs torch with CUDA")
@pytest.mark.parametrize("backend", SDPA_BACKENDS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal", [False, True])
def test_torch_sdpa_kernels_pass_the_oracle(backend, dtype, causal):
    t = TORCH
    dt = getattr(t, dtype)
    g = t.Generator(device="cuda").manual_seed(0)
    b, h, sq, sk, d = 2, 8, 197, 197, 64
    q = t.randn(b, h, sq, d, device="cuda", dtype=dt, generator=g, requires_grad=True)
    k = t.randn(b, h, sk, d, device="cuda", dtype=dt, generator=g, requires_grad=True)
    v = t.randn(b, h, sk, d, device="cuda", dtype=dt, generator=g, requires_grad=True)
    try:
        out = _sdpa(backend, q, k, v, is_causal=causal)
    except RuntimeError as e:  # a kernel this GPU or build lacks
        pytest.skip(f"{backend}: {e}")
    dout = t.randn_like(out)
    out.backward(dout)
    r = fa.check(q.detach(), k.detach(), v.detach(), out=out.detach(), dout=dout,
                 dq=q.grad, dk=k.grad, dv=v.grad, causal=causal, layout="bhsd",
                 profile="pytorch")
    assert r, str(r)


@pytest.mark.skipif(not CUDA, reason="needs torch with CUDA")
def test_torch_sdpa_gqa_checked():
    t = TORCH
    g = t.Generator(device="cuda").manual_seed(1)
    q = t.randn(1, 8, 100, 64, device="cuda", dtype=t.bfloat16, generator=g)
    k = t.randn(1, 2, 130, 64, device="cuda", dtype=t.bfloat16, generator=g)
    v = t.randn(1, 2, 130, 64, device="cuda", dtype=t.bfloat16, generator=g)
    out = t.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert fa.check(q, k, v, out=out, causal=True, layout="bhsd", profile="pytorch")


@pytest.mark.skipif(not CUDA, reason="needs torch with CUDA")
def test_torch_cuda_tensors_run_on_the_cuda_backend():
    """FLASHATTN_EXPECT_CUDA=1 (a wheel built with --enable-cuda) makes a library without
    CUDA a failure instead of a skip."""
    import os
    t = TORCH
    q, k, v = (t.from_numpy(x).to("cuda", t.bfloat16) for x in qkv(6))
    try:
        out, lse = fa.attention(q, k, v, causal=True, return_lse=True)
    except fa.BackendUnavailableError as e:
        if os.environ.get("FLASHATTN_EXPECT_CUDA") == "1":
            raise
        pytest.skip(f"the library was built without CUDA: {e}")
    assert out.is_cuda and out.dtype == t.bfloat16 and lse.is_cuda
    assert fa.check(q, k, v, out=out, lse=lse, causal=True)
    dout = t.randn_like(out)
    dq, dk, dv = fa.attention_backward(dout, q, k, v, out, lse, causal=True)
    assert dq.is_cuda
    assert fa.check(q, k, v, dout=dout, dq=dq, dk=dk, dv=dv, causal=True)
    s = t.cuda.Stream()
    with t.cuda.stream(s):  # on the caller's current stream
        out2 = fa.attention(q, k, v, causal=True)
    s.synchronize()
    assert t.equal(out2, out)
    assert any(key[3] == s.cuda_stream for key in fa._native.contexts._made)
    with pytest.raises(fa.InvalidArgumentError, match="GPU"):
        fa.attention(q, k, v, backend="tiled")


# ------------------------------------------------------------------ CuPy


def _cupy_gpu():
    cupy = _import("cupy")
    try:
        return cupy if cupy is not None and cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # a CuPy without a driver or device
        return None


CUPY = _cupy_gpu()


@pytest.mark.skipif(CUPY is None, reason="needs cupy with a GPU")
def test_cupy_arrays_run_on_the_cuda_backend():
    import os
    cp = CUPY
    q, k, v = (cp.asarray(x.astype(np.float16)) for x in qkv(8))
    try:
        out, lse = fa.attention(q, k, v, causal=True, return_lse=True)
    except fa.BackendUnavailableError as e:
        if os.environ.get("FLASHATTN_EXPECT_CUDA") == "1":
            raise
        pytest.skip(f"the library was built without CUDA: {e}")
    assert isinstance(out, cp.ndarray) and out.dtype == cp.float16
    assert fa._api.last_call["q"].data == q.data.ptr  # read in place, on the device
    assert fa.check(q, k, v, out=out, lse=lse, causal=True)
    host = fa.attention(*(cp.asnumpy(x) for x in (q, k, v)), causal=True)
    assert np.abs(cp.asnumpy(out).astype(np.float32) - host.astype(np.float32)).max() < 2e-3
