"""FP8 inputs (float8_e4m3fn, float8_e5m2: ml_dtypes' or torch's) with descale factors per
tensor or per (batch, kv head): the codes reach the library as numpy widens them, the
forward equals numpy attention on the widened descaled values, the oracle checks FP8
kernels against the conventional FP8 path, and bad descales are refused by name."""
import numpy as np
import pytest

import flashattn as fa
import numpy_attention as ref

ml_dtypes = pytest.importorskip("ml_dtypes")
try:
    import torch
except ImportError:
    torch = None

NAMES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}  # ml_dtypes' and torch's
FORMATS = {fmt: getattr(ml_dtypes, name) for fmt, name in NAMES.items()}
B, SQ, SK, H, HK, D = 3, 9, 13, 4, 2, 16


def fp8_qkv(fmt, seed=0, hk=HK):
    rng = np.random.default_rng(seed)
    return tuple((rng.standard_normal(s) * 2).astype(FORMATS[fmt])
                 for s in ((B, SQ, H, D), (B, SK, hk, D), (B, SK, hk, D)))


def widened(x, descale, per_head_of=None):
    """x's values in float64 times its descale: a number, or (B, Hk) broadcast to x's heads
    (q's head h takes kv head h // (Hq / Hk))."""
    d = np.asarray(descale, np.float64)
    if d.ndim == 2:
        d = np.repeat(d, x.shape[2] // d.shape[1], axis=1)[:, None, :, None]
    return x.astype(np.float64) * d


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_code_goes_through_as_ml_dtypes_widens_it(fmt):
    """One key: P = 1, so out = descale_v x v exactly; v holds all 256 codes (NaN and, for
    e5m2, the infinities included)."""
    codes = np.arange(256, dtype=np.uint8).view(FORMATS[fmt]).reshape(1, 1, 1, 256)
    q, k = (np.ones((1, 1, 1, 4), FORMATS[fmt]) for _ in range(2))
    out = fa.attention(q, k, codes, descale_v=0.5, out_dtype="float64", backend="reference")
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, codes.astype(np.float64) * 0.5)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("causal", [False, True])
def test_forward_equals_numpy_on_the_descaled_values(fmt, causal):
    q, k, v = fp8_qkv(fmt, 1)
    dq, dk, dv = 0.75, 1.5, 3.0
    want, want_lse, _ = ref.forward(widened(q, dq), widened(k, dk), widened(v, dv),
                                    causal=causal)
    out, lse = fa.attention(q, k, v, causal=causal, descale_q=dq, descale_k=np.float32(dk),
                            descale_v=np.array([dv]), out_dtype=np.float64, return_lse=True,
                            backend="reference")
    assert out.dtype == lse.dtype == np.float64
    assert np.abs(out - want).max() <= 1e-12 * max(1, np.abs(want).max())
    assert np.abs(lse - want_lse).max() <= 1e-12 * max(1, np.abs(want_lse).max())
    tiled = fa.attention(q, k, v, causal=causal, descale_q=dq, descale_k=dk, descale_v=dv,
                         backend="tiled")
    assert tiled.dtype == ml_dtypes.bfloat16  # FlashAttention-3's default
    assert np.abs(tiled.astype(np.float64) - want).max() <= 0.05 * np.abs(want).max()


def per_head_descales(seed):
    rng = np.random.default_rng(seed)
    return tuple(rng.uniform(0.25, 4, (B, HK)).astype(np.float32) for _ in range(3))


@pytest.mark.parametrize("fmt", FORMATS)
def test_per_kv_head_descales_with_gqa(fmt):
    q, k, v = fp8_qkv(fmt, 2)
    dq, dk, dv = per_head_descales(3)
    want, _, _ = ref.forward(widened(q, dq), widened(k, dk), widened(v, dv))
    out = fa.attention(q, k, v, descale_q=dq, descale_k=dk, descale_v=dv, out_dtype="f64",
                       backend="reference")
    assert np.abs(out - want).max() <= 1e-12 * np.abs(want).max()
    # per tensor is the per-head case with every head's factor the same
    same = fa.attention(q, k, v, descale_v=np.full((B, HK), 2.0), out_dtype="float32",
                        backend="tiled")
    assert np.array_equal(same, fa.attention(q, k, v, descale_v=2.0, out_dtype="float32",
                                             backend="tiled"))


@pytest.mark.parametrize("fmt", FORMATS)
def test_check_passes_the_tiled_output_and_fails_a_forgotten_descale_v(fmt):
    q, k, v = fp8_qkv(fmt, 4)
    ds = dict(zip(("descale_q", "descale_k", "descale_v"), per_head_descales(5)))
    good = fa.attention(q, k, v, causal=True, backend="tiled", **ds)
    report = fa.testing.assert_attention_close(q, k, v, out=good, causal=True, **ds)
    assert report.storage_dtype == f"{NAMES[fmt]} (out bfloat16)"
    f32 = fa.attention(q, k, v, causal=True, backend="tiled", out_dtype="float32", **ds)
    assert fa.check(q, k, v, out=f32, causal=True, **ds)  # the yardstick in f32 then
    forgot = fa.attention(q, k, v, causal=True, backend="tiled",
                          descale_q=ds["descale_q"], descale_k=ds["descale_k"])
    assert not fa.check(q, k, v, out=forgot, causal=True, **ds)
    with pytest.raises(AssertionError, match="FAIL"):
        fa.testing.assert_attention_close(q, k, v, out=forgot, causal=True, **ds)


def one_bad_head(x):
    d = np.ones((B, HK), np.float32)
    d[B - 1, HK - 1] = x
    return d


@pytest.mark.parametrize("name", ["descale_q", "descale_k", "descale_v"])
@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), one_bad_head(0.0),
                                 one_bad_head(float("nan")), np.ones(3), np.ones((HK, B)),
                                 np.ones((B, HK, 1)), np.ones(0)])
def test_a_bad_descale_is_refused_by_name(name, bad):
    q, k, v = fp8_qkv("e4m3")
    with pytest.raises(fa.InvalidArgumentError, match=name):
        fa.attention(q, k, v, **{name: bad})
    with pytest.raises(fa.InvalidArgumentError, match=name):
        fa.check(q, k, v, out=fa.attention(q, k, v), **{name: bad})


def test_descale_layouts_do_not_mix_and_need_fp8():
    q, k, v = fp8_qkv("e5m2")
    with pytest.raises(ValueError, match="one layout"):
        fa.attention(q, k, v, descale_q=1.0, descale_v=np.ones((B, HK)))
    with pytest.raises(fa.InvalidArgumentError, match="descale_q"):
        fa.attention(*(x.astype(np.float32) for x in (q, k, v)), descale_q=2.0)
    with pytest.raises(fa.InvalidArgumentError, match="out_dtype"):
        fa.attention(*(x.astype(np.float32) for x in (q, k, v)), out_dtype="bfloat16")
    with pytest.raises(fa.InvalidArgumentError, match="out_dtype"):
        fa.attention(q, k, v, out_dtype="float8_e5m2")


def test_fp8_backward_is_refused():
    q, k, v = fp8_qkv("e4m3")
    out, lse = fa.attention(q, k, v, return_lse=True)
    with pytest.raises(fa.UnsupportedError, match="forward only"):
        fa.attention_backward(out, q, k, v, out, lse)


def test_an_fp8_kv_cache_under_float32_q():
    q, k, v = fp8_qkv("e4m3", 6)
    q32 = q.astype(np.float32) * 0.5
    want, _, _ = ref.forward(q32, widened(k, 2.0), widened(v, 0.25))
    out = fa.attention(q32, k, v, descale_k=2.0, descale_v=0.25, backend="reference")
    assert out.dtype == np.float32
    assert np.abs(out - want).max() <= 1e-6 * np.abs(want).max()
    with pytest.raises(fa.UnsupportedError, match="FP8 K/V under wider q"):
        fa.check(q32, k, v, out=out)  # the oracle has no yardstick for it


@pytest.mark.skipif(torch is None, reason="needs torch")
@pytest.mark.parametrize("fmt", FORMATS)
def test_torch_fp8_tensors(fmt):
    """torch's DLPack exports no FP8: the package reads the tensors' bytes as uint8."""
    q, k, v = fp8_qkv(fmt, 7)
    tq, tk, tv = (torch.from_numpy(x.view(np.uint8)).view(getattr(torch, NAMES[fmt]))
                  for x in (q, k, v))
    dv = torch.full((B, HK), 1.5)
    out = fa.attention(tq, tk, tv, descale_v=dv, backend="tiled")
    assert out.dtype == torch.bfloat16
    want = fa.attention(q, k, v, descale_v=dv.numpy(), backend="tiled")
    assert np.array_equal(out.float().numpy(), want.astype(np.float32))
    assert fa.check(tq, tk, tv, out=out, descale_v=dv)
