"""attn_mask (fa_params.bias): a bool keep-mask or an additive float bias in PyTorch SDPA's
(B, H, Sq, Sk) order, broadcast from fewer dims, dims of 1 or zero strides; its gradient
(bias_grad); the oracle's pass-through and the profiles' empty rows (empty_out)."""
import numpy as np
import pytest

import flashattn as fa
import numpy_attention as ref

try:
    import torch
except ImportError:
    torch = None

B, SQ, SK, H, HK, D = 2, 37, 45, 4, 2, 16


def qkv(seed=0, dt=np.float32, b=B, sq=SQ, sk=SK, h=H, hk=HK, d=D):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((b, sq, h, d)).astype(dt),
            rng.standard_normal((b, sk, hk, d)).astype(dt),
            rng.standard_normal((b, sk, hk, d)).astype(dt))


def bias_of(shape, seed=1, dt=np.float32):
    return np.random.default_rng(seed).uniform(-2, 2, shape).astype(dt)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_bool_mask_is_causal_bitwise(layout):
    q, k, v = (np.swapaxes(x, 1, 2) if layout == "bhsd" else x for x in qkv(0))
    keep = ref.allowed(SQ, SK, causal=True)  # bottom-right, as causal=True here
    want, want_lse = fa.attention(q, k, v, layout=layout, causal=True, return_lse=True,
                                  backend="tiled")
    out, lse = fa.attention(q, k, v, layout=layout, attn_mask=keep, return_lse=True,
                            backend="tiled")
    assert np.array_equal(out, want) and np.array_equal(lse, want_lse)


@pytest.mark.parametrize("backend", ["reference", "conventional", "tiled"])
def test_minus_inf_bias_is_a_sliding_window(backend):
    """Bitwise where every key is visited; the tiled backend skips the tiles left of a
    window, so its online softmax starts elsewhere (an ulp or two)."""
    q, k, v = qkv(1)
    window = (6, 3)
    bias = np.where(ref.allowed(SQ, SK, window=window), 0.0, -np.inf).astype(np.float32)
    want = fa.attention(q, k, v, window=window, backend=backend)
    out = fa.attention(q, k, v, attn_mask=bias, backend=backend)
    assert np.abs(out - want).max() <= (1e-6 if backend == "tiled" else 0)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("shape", [(B, H, SQ, SK), (B, 1, SQ, SK), (1, H, 1, SK), (SQ, SK),
                                   (H, SQ, SK), (SK,)])
def test_float_bias_matches_numpy(shape, layout):
    q, k, v = qkv(2, np.float64)
    bias = bias_of(shape, 3, np.float64)
    want, want_lse, _ = ref.forward(q, k, v, bias=bias, causal=True)
    args = [np.swapaxes(x, 1, 2) if layout == "bhsd" else x for x in (q, k, v)]
    out, lse = fa.attention(*args, layout=layout, attn_mask=bias, causal=True, return_lse=True)
    if layout == "bhsd":
        out = np.swapaxes(out, 1, 2)
    assert np.abs(out - want).max() < 1e-12 and np.abs(lse - want_lse).max() < 1e-12


@pytest.mark.parametrize("keep", [False, True], ids=["float", "bool"])
def test_broadcast_dims_are_the_repeated_mask_bitwise(keep):
    q, k, v = qkv(4)
    small = bias_of((1, 1, SQ, SK), 5)
    if keep:
        small = small > -1
    full = np.ascontiguousarray(np.broadcast_to(small, (B, H, SQ, SK)))
    want = fa.attention(q, k, v, attn_mask=full)
    for m in (small, small[0, 0], small[0]):
        assert np.array_equal(fa.attention(q, k, v, attn_mask=m), want)


def test_zero_stride_views_are_read_in_place():
    q, k, v = qkv(6)
    row = bias_of((1, 1, SQ, SK), 7)
    view = np.broadcast_to(row, (B, H, SQ, SK))  # batch and head strides 0
    want = fa.attention(q, k, v, attn_mask=np.ascontiguousarray(view))
    assert np.array_equal(fa.attention(q, k, v, attn_mask=view), want)
    t = fa._api.last_call["attn_mask"]
    assert t.data == row.ctypes.data and t.batch == B and t.heads == H  # no copy
    assert (t.batch_stride, t.head_stride, t.seq_stride) == (0, 0, SK)


@pytest.mark.parametrize("strided", [lambda m: m[..., ::2], lambda m: np.swapaxes(m, 1, 2),
                                     lambda m: m[..., ::-1]],
                         ids=["key-stride-2", "transposed", "reversed"])
def test_a_key_axis_not_contiguous_is_copied(strided):
    q, k, v = qkv(8)
    m = strided(bias_of((H, 2 * SK, 2 * SK), 9))[:, :SQ, :SK]
    assert m.shape == (H, SQ, SK) and m.strides[-1] != 4
    want = fa.attention(q, k, v, attn_mask=np.ascontiguousarray(m))
    assert np.array_equal(fa.attention(q, k, v, attn_mask=m), want)


def test_bias_place_and_slopes():
    q, k, v = qkv(10, np.float64)
    bias = bias_of((SQ, SK), 11, np.float64)
    soft = dict(softcap=1.5, attn_mask=bias)
    after_scale = fa.attention(q, k, v, **soft)
    want, _, _ = ref.forward(q, k, v, softcap=1.5, bias=bias)
    assert np.abs(after_scale - want).max() < 1e-12
    after_cap = fa.attention(q, k, v, bias_place="after-softcap", **soft)
    s = 1.5 * np.tanh(np.einsum("bihd,bjhd->bhij", q, np.repeat(k, 2, 2)) / np.sqrt(D) / 1.5)
    p = np.exp(s + bias - (s + bias).max(-1, keepdims=True))
    want = np.einsum("bhij,bjhd->bihd", p / p.sum(-1, keepdims=True), np.repeat(v, 2, 2))
    assert np.abs(after_cap - want).max() < 1e-12
    slopes = np.float32([0.5, 0.25, 2.0, 1.0])  # ggml: the slope scales the bias
    by_slope = fa.attention(q, k, v, attn_mask=bias, alibi_slopes=slopes, bias_by_slope=True)
    want, _, _ = ref.forward(q, k, v, bias=slopes.astype(np.float64)[:, None, None] * bias)
    assert np.abs(by_slope - want).max() < 1e-12
    with pytest.raises(fa.InvalidArgumentError, match="bias_place"):
        fa.attention(q, k, v, attn_mask=bias, bias_place="before_scale")


def _loss_and_grad(q, k, v, dout, bias, **opts):
    out, lse = fa.attention(q, k, v, attn_mask=bias, return_lse=True, **opts)
    return float((out * dout).sum()), fa.attention_backward(
        dout, q, k, v, out, lse, attn_mask=bias, bias_grad=True, **opts)[-1]


@pytest.mark.parametrize("opts", [{}, {"causal": True, "softcap": 2.0},
                                  {"bias_place": "after-softcap", "softcap": 2.0}],
                         ids=["plain", "causal-softcap", "after-softcap"])
def test_bias_gradient_is_the_finite_difference(opts):
    q, k, v = qkv(12, np.float64, b=1, sq=3, sk=4, h=2, hk=1, d=4)
    dout = np.random.default_rng(13).standard_normal(q.shape)
    bias = bias_of((1, 2, 3, 4), 14, np.float64)
    _, g = _loss_and_grad(q, k, v, dout, bias, **opts)
    assert g.shape == bias.shape and g.dtype == np.float64
    fd, eps = np.zeros_like(bias), 1e-6
    for i in np.ndindex(bias.shape):
        plus, minus = bias.copy(), bias.copy()
        plus[i] += eps
        minus[i] -= eps
        fd[i] = (_loss_and_grad(q, k, v, dout, plus, **opts)[0] -
                 _loss_and_grad(q, k, v, dout, minus, **opts)[0]) / (2 * eps)
    assert np.abs(g - fd).max() < 1e-8, (g, fd)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_broadcast_bias_gradient_is_the_sum_over_heads(dt):
    q, k, v = qkv(15, dt)
    dout = np.random.default_rng(16).standard_normal(q.shape).astype(dt)
    small = bias_of((B, 1, SQ, SK), 17, dt)
    full = np.ascontiguousarray(np.broadcast_to(small, (B, H, SQ, SK)))
    _, g_small = _loss_and_grad(q, k, v, dout, small, causal=True)
    _, g_full = _loss_and_grad(q, k, v, dout, full, causal=True)
    assert g_small.shape == small.shape and g_small.dtype == dt
    assert g_full.shape == full.shape
    tol = 1e-12 if dt == np.float64 else 1e-5
    assert np.abs(g_small - g_full.sum(1, keepdims=True)).max() < tol
    plane = small[0, 0]  # (Sq, Sk): summed over batch and heads
    _, g_plane = _loss_and_grad(q, k, v, dout, plane, causal=True)
    _, g_full = _loss_and_grad(q, k, v, dout, np.broadcast_to(plane, (B, H, SQ, SK)).copy(),
                               causal=True)
    assert g_plane.shape == (SQ, SK) and np.abs(g_plane - g_full.sum((0, 1))).max() < 2 * tol


def test_a_fully_masked_row_is_empty():
    q, k, v = qkv(18)
    keep = np.ones((B, H, SQ, SK), bool)
    keep[1, 2, 5] = False
    bias = np.where(keep, 0.0, -np.inf).astype(np.float32)
    for m in (keep, bias):
        out, lse = fa.attention(q, k, v, attn_mask=m, return_lse=True)
        assert np.all(out[1, 5, 2] == 0) and lse[1, 2, 5] == -np.inf
        assert np.isfinite(lse).sum() == lse.size - 1
    dout = np.ones_like(q)
    dq, dk, dv, db = fa.attention_backward(dout, q, k, v, out, lse, attn_mask=bias,
                                           bias_grad=True)
    assert np.all(dq[1, 5, 2] == 0) and np.all(db[1, 2, 5] == 0)


@pytest.mark.parametrize("mask, says", [
    (np.zeros((B, H, SQ, SK - 1), np.float32), "bias->headdim"),
    (np.zeros((B, 3, SQ, SK), np.float32), "bias->heads"),
    (np.zeros((3, H, SQ, SK), np.float32), "bias->batch"),
    (np.zeros((1, B, H, SQ, SK), np.float32), "attn_mask (the bias): expected at most 4"),
    (np.zeros((SQ, SK), np.int32), "dtype"),
])
def test_bad_masks_raise(mask, says):
    q, k, v = qkv(19)
    with pytest.raises((fa.InvalidArgumentError, TypeError), match="bias|attn_mask") as e:
        fa.attention(q, k, v, attn_mask=mask)
    assert says in str(e.value), str(e.value)


def test_bias_gradient_of_a_keep_mask_raises_before_the_call(monkeypatch):
    q, k, v = qkv(20)
    out, lse = fa.attention(q, k, v, return_lse=True)
    monkeypatch.setattr(fa._native.lib, "fa_backward", None)  # never reached
    with pytest.raises(ValueError, match="bool keep-mask"):
        fa.attention_backward(out, q, k, v, out, lse, attn_mask=np.ones((SQ, SK), bool),
                              bias_grad=True)
    with pytest.raises(ValueError, match="attn_mask is None"):
        fa.attention_backward(out, q, k, v, out, lse, bias_grad=True)


def test_only_the_mask_may_be_bool():
    q, k, v = qkv(21)
    with pytest.raises(TypeError, match="only attn_mask may be bool"):
        fa.attention(q > 0, k, v)


def test_calls_of_sequences_take_no_mask():
    q, k, v = qkv(22)
    with pytest.raises(TypeError, match="attn_mask"):
        fa.attention_varlen(q[0], k[0], v[0], [0, SQ], [0, SK], attn_mask=np.ones((SQ, SK)))


# ------------------------------------------------------------------ the oracle


def test_check_runs_the_reference_with_the_mask():
    q, k, v = qkv(23)
    bias = bias_of((H, SQ, SK), 24)
    dout = np.random.default_rng(25).standard_normal(q.shape).astype(np.float32)
    out, lse = fa.attention(q, k, v, attn_mask=bias, causal=True, return_lse=True)
    dq, dk, dv = fa.attention_backward(dout, q, k, v, out, lse, attn_mask=bias, causal=True)
    r = fa.check(q, k, v, out=out, lse=lse, dq=dq, dk=dk, dv=dv, dout=dout, attn_mask=bias,
                 causal=True)
    assert r, str(r)
    assert not fa.check(q, k, v, out=out, causal=True)  # without the mask
    from flashattn.testing import assert_attention_close
    assert_attention_close(q, k, v, out=out, attn_mask=bias, causal=True)
    keep = bias > -1
    assert fa.check(q, k, v, out=fa.attention(q, k, v, attn_mask=keep), attn_mask=keep)


def test_check_applies_the_profiles_bias_place_and_slopes():
    q, k, v = qkv(26)
    bias = bias_of((SQ, SK), 27)
    slopes = np.float32([0.5, 0.25, 2.0, 1.0])
    out = fa.attention(q, k, v, attn_mask=bias, alibi_slopes=slopes, softcap=3.0,
                       bias_place="after-softcap", bias_by_slope=True)
    assert fa.check(q, k, v, out=out, attn_mask=bias, alibi_slopes=slopes, softcap=3.0,
                    profile="ggml")
    assert not fa.check(q, k, v, out=out, attn_mask=bias, alibi_slopes=slopes, softcap=3.0)


def _empty_row_case():
    q, k, v = qkv(28)
    keep = np.ones((SQ, SK), bool)
    keep[4] = False  # row 4 of every batch and head sees no key
    out = fa.attention(q, k, v, attn_mask=keep)
    return q, k, v, keep, out


def test_check_empty_rows_zero_and_not_compared():
    q, k, v, keep, out = _empty_row_case()
    assert np.all(out[:, 4] == 0) and fa.check(q, k, v, out=out, attn_mask=keep)
    junk = out.copy()
    junk[:, 4] = np.nan  # softmax over -inf only, as SDPA's math path gives
    assert not fa.check(q, k, v, out=junk, attn_mask=keep)  # the library's O = 0
    r = fa.check(q, k, v, out=junk, attn_mask=keep, profile="pytorch")  # no defined value
    assert r, str(r)
    junk[:, 4] = 7.0  # nor does it widen the yardstick's error (the bound)
    junk[:, 3, 1, 2] += 0.5  # a row with keys is still compared
    assert not fa.check(q, k, v, out=junk, attn_mask=keep, profile="pytorch")


def test_check_empty_rows_nan_where_the_profile_says(monkeypatch):
    q, k, v, keep, out = _empty_row_case()
    pf = fa._native.Profile.from_buffer_copy(fa._native.lib.fa_profile_find(b"fa2").contents)
    pf.empty_out = fa._native.EMPTY_OUT_NAN  # no profile writes NaN yet
    monkeypatch.setattr(fa._check, "_profile", lambda name: fa._native.ctypes.pointer(pf))
    nan = out.copy()
    nan[:, 4] = np.nan
    r = fa.check(q, k, v, out=nan, attn_mask=keep)
    assert r, str(r)
    assert not fa.check(q, k, v, out=out, attn_mask=keep)  # zeros where NaN is expected


# ------------------------------------------------------------------ PyTorch


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_torch_masks():
    q, k, v = (torch.from_numpy(x) for x in qkv(29))
    keep = torch.from_numpy(ref.allowed(SQ, SK, causal=True))
    out = fa.attention(q, k, v, attn_mask=keep)
    assert isinstance(out, torch.Tensor)
    assert torch.equal(out, fa.attention(q, k, v, causal=True))
    bias = torch.from_numpy(bias_of((1, 1, SQ, SK), 30)).expand(B, H, SQ, SK)  # stride 0
    out, lse = fa.attention(q, k, v, attn_mask=bias, return_lse=True)
    want = fa.attention(*(x.numpy() for x in (q, k, v)), attn_mask=bias.numpy())
    assert np.array_equal(out.numpy(), want)
    *_, db = fa.attention_backward(out, q, k, v, out, lse, attn_mask=bias, bias_grad=True)
    assert isinstance(db, torch.Tensor) and db.shape == bias.shape
    assert fa.check(q, k, v, out=out, attn_mask=bias)
    keys_apart = torch.from_numpy(bias_of((H, SK, SQ), 31)).transpose(1, 2)  # copied
    want = fa.attention(*(x.numpy() for x in (q, k, v)), attn_mask=keys_apart.contiguous().numpy())
    assert np.array_equal(fa.attention(q, k, v, attn_mask=keys_apart).numpy(), want)
    with pytest.raises(ValueError, match="bool keep-mask"):
        fa.attention_backward(out, q, k, v, out, lse, attn_mask=keep, bias_grad=True)
