"""The oracle from Python: flashattn.check PASSes honest kernels (numpy, float32 and bfloat16,
written here the FlashAttention way: key blocks and an online softmax) and FAILs the bugs
such kernels really have; the convention profiles; assert_attention_close."""
import re

import numpy as np
import pytest

import flashattn as fa
from flashattn.testing import assert_attention_close

try:
    import ml_dtypes
    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:
    BF16 = None


def kernel(q, k, v, *, causal=False, top_left=False, block=16, scale=None, bug=None,
           scale_error=0.001, acc=np.float32):
    """A blocked online-softmax forward in `acc` precision: (out in q's dtype, lse float32).
    bug: None, "mask-off-by-one" (each row also sees the next key), "no-max" (exp without
    subtracting the running max), "scale" (the scale off by scale_error), "dropped-tile" (the
    last key block is skipped)."""
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    g = hq // hk
    scale = (1 / np.sqrt(d) if scale is None else scale) * (1 + scale_error if bug == "scale" else 1)
    qf, kf, vf = (x.astype(acc) for x in (q, k, v))
    out = np.zeros((b, sq, hq, v.shape[3]), acc)
    lse = np.full((b, hq, sq), -np.inf, np.float32)
    off = 0 if top_left else sk - sq
    for bb in range(b):
        for h in range(hq):
            m = np.full(sq, -np.inf, acc)
            l = np.zeros(sq, acc)
            o = np.zeros((sq, v.shape[3]), acc)
            starts = list(range(0, sk, block))
            if bug == "dropped-tile" and len(starts) > 1:
                starts = starts[:-1]
            for j0 in starts:
                j1 = min(j0 + block, sk)
                s = (qf[bb, :, h] @ kf[bb, j0:j1, h // g].T * acc(scale)).astype(acc)
                if causal:
                    i = np.arange(sq)[:, None]
                    j = np.arange(j0, j1)[None, :]
                    limit = i + off + (1 if bug == "mask-off-by-one" else 0)
                    s = np.where(j <= limit, s, -np.inf).astype(acc)
                if bug == "no-max":
                    with np.errstate(over="ignore", invalid="ignore"):
                        p = np.exp(s)
                        l = l + p.sum(1)
                        o = o + p @ vf[bb, j0:j1, h // g]
                    continue
                mn = np.maximum(m, s.max(1))
                live = np.isfinite(mn)
                a = np.where(live, np.exp(np.where(live, m - mn, 0)), 0)
                p = np.where(live[:, None], np.exp(s - np.where(live, mn, 0)[:, None]), 0)
                l = a * l + p.sum(1)
                o = a[:, None] * o + p @ vf[bb, j0:j1, h // g]
                m = mn
            with np.errstate(divide="ignore", invalid="ignore"):
                out[bb, :, h] = np.where(l[:, None] > 0, o / l[:, None], 0)
                lse[bb, h] = (np.log(l) if bug == "no-max" else
                              np.where(l > 0, m + np.log(l), -np.inf))
    return out.astype(q.dtype), lse


def inputs(dt, seed=0, b=2, sq=40, sk=50, hq=4, hk=2, d=32, spread=1.0):
    rng = np.random.default_rng(seed)
    mk = lambda *s: (rng.standard_normal(s) * spread).astype(dt)
    return mk(b, sq, hq, d), mk(b, sk, hk, d), mk(b, sk, hk, d)


DTYPES = [pytest.param(np.float32, id="f32"),
          pytest.param("bf16", id="bf16", marks=pytest.mark.skipif(BF16 is None,
                                                                    reason="needs ml_dtypes"))]


def dtype_of(dt):
    return BF16 if dt == "bf16" else dt


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_honest_kernels_pass(dt, causal):
    q, k, v = inputs(dtype_of(dt))
    out, lse = kernel(q, k, v, causal=causal)
    report = fa.check(q, k, v, out=out, lse=lse, causal=causal)
    assert report, str(report)
    assert report.storage_dtype == ("bfloat16" if dt == "bf16" else "float32")
    assert set(report.tensors) == {"out", "lse"}


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("bug, spread", [("mask-off-by-one", 1.0), ("no-max", 12.0),
                                         ("scale", 1.0), ("dropped-tile", 1.0)])
def test_realistic_bugs_fail(dt, bug, spread):
    """The scale's error is 0.1% in float32 and 2% in bfloat16, whose own rounding (2^-9
    relative) hides 0.1% from any rule that passes honest bfloat16 kernels."""
    q, k, v = inputs(dtype_of(dt), seed=1, spread=spread)
    honest, _ = kernel(q, k, v, causal=True)
    assert fa.check(q, k, v, out=honest, causal=True), "the honest kernel passes these inputs"
    out, lse = kernel(q, k, v, causal=True, bug=bug, scale_error=0.02 if dt == "bf16" else 0.001)
    report = fa.check(q, k, v, out=out, causal=True)
    assert not report and not report["out"].passed, str(report)


def test_the_worst_element_is_reported_in_the_callers_order():
    q, k, v = inputs(np.float32, seed=2)
    out, _ = kernel(q, k, v)
    out[1, 7, 3, 5] += 0.5
    r = fa.check(q, k, v, out=out)["out"]
    assert r.worst_index == (1, 7, 3, 5) and not r.passed
    assert abs(r.worst_candidate - r.worst_reference - 0.5) < 1e-3
    rb = fa.check(*(np.swapaxes(x, 1, 2) for x in (q, k, v)), out=np.swapaxes(out, 1, 2),
                  layout="bhsd")["out"]
    assert rb.worst_index == (1, 3, 7, 5)


def test_gradients_checked():
    q, k, v = inputs(np.float32, seed=3, sq=24, sk=24)
    dout = np.random.default_rng(4).standard_normal(q.shape).astype(np.float32)
    out, lse = fa.attention(q, k, v, causal=True, return_lse=True)
    dq, dk, dv = fa.attention_backward(dout, q, k, v, out, lse, causal=True)
    assert fa.check(q, k, v, dout=dout, dq=dq, dk=dk, dv=dv, causal=True)
    bad = dk.copy()
    bad[0, :, 1] *= 1.01  # one kv head's gradient off by 1%
    r = fa.check(q, k, v, dout=dout, dq=dq, dk=bad, dv=dv, causal=True)
    assert not r and r["dq"].passed and not r["dk"].passed
    with pytest.raises(fa.InvalidArgumentError, match="dout"):
        fa.check(q, k, v, dq=dq, causal=True)


def test_a_top_left_result_checked_as_bottom_right_fails():
    q, k, v = inputs(np.float32, seed=5, sq=20, sk=30)
    out, _ = kernel(q, k, v, causal=True, top_left=True)
    assert not fa.check(q, k, v, out=out, causal=True)  # the library's bottom-right
    assert fa.check(q, k, v, out=out, causal=True, profile="pytorch")  # top-left
    assert fa.check(q, k, v, out=out, causal=True, align="top-left")


def test_profiles_lse_conventions():
    q, k, v = inputs(np.float32, seed=6, sq=30, sk=10)
    out, lse = fa.attention(q, k, v, causal=True, align="top-left", return_lse=True)
    # FlashInfer writes log2-sum-exp2
    assert fa.check(q, k, v, lse=lse / np.log(2), causal=True, profile="flashinfer",
                    align="top-left")
    assert not fa.check(q, k, v, lse=lse, causal=True, profile="flashinfer", align="top-left")
    # bottom-right with Sq > Sk leaves rows without a key: FA2 writes +inf there
    out, lse = fa.attention(q, k, v, causal=True, return_lse=True)
    assert np.isneginf(lse).any()
    fa2 = np.where(np.isneginf(lse), np.inf, lse).astype(np.float32)
    assert fa.check(q, k, v, lse=fa2, causal=True, profile="fa2")
    assert not fa.check(q, k, v, lse=fa2, causal=True)  # -inf is the library's own
    # profiles whose empty rows carry no defined value do not compare them
    junk = np.where(np.isneginf(lse), -5e4, lse / np.log(2)).astype(np.float32)
    assert fa.check(q, k, v, lse=junk, causal=True, profile="flashinfer", align="bottom-right")
    with pytest.raises(fa.InvalidArgumentError, match="no LSE"):
        fa.check(q, k, v, lse=lse, causal=True, profile="ggml")
    assert set(fa.profile_names()) >= {"flashattn", "fa2", "fa3", "pytorch", "flashinfer",
                                       "xformers", "ggml"}


def test_window_as_a_key_count_under_xformers():
    q, k, v = inputs(np.float32, seed=7, sq=20, sk=20)
    out = fa.attention(q, k, v, window=(4, 0))  # 5 keys: the query's own and 4 before
    assert fa.check(q, k, v, out=out, window=5, profile="xformers")
    assert not fa.check(q, k, v, out=out, window=5)  # here 5 is the left bound
    # a count below 1 is refused with the library's reason (fa_profile_apply)
    with pytest.raises(fa.InvalidArgumentError, match="window = 0: profile xformers counts keys"):
        fa.check(q, k, v, out=out, window=0, profile="xformers")


def test_tolerances_are_checked_first():
    q, k, v = inputs(np.float32, seed=18)
    for bad in (dict(atol=float("inf")), dict(atol=-1.0), dict(rtol=float("nan"))):
        with pytest.raises(fa.InvalidArgumentError, match="atol|rtol"):
            fa.check(q, k, v, out=np.zeros((2, 40, 4, 32), np.float32), **bad)
    out, _ = kernel(q, k, v)
    assert fa.check(q, k, v, out=out, dtype="f32").storage_dtype == "float32"
    assert fa.check(q, k, v, out=out, dtype=np.dtype(np.float16)).storage_dtype == "float16"


def test_explicit_tolerance():
    q, k, v = inputs(np.float32, seed=8)
    out, _ = kernel(q, k, v)
    r = fa.check(q, k, v, out=out + 1e-4, atol=2e-4)
    assert r and r.explicit_rule and "explicit" in r["out"].rule
    assert not fa.check(q, k, v, out=out + 1e-4, atol=5e-5)


def test_nan_where_the_reference_has_none_fails():
    q, k, v = inputs(np.float32, seed=9)
    out, _ = kernel(q, k, v)
    out[0, 0, 0, 0] = np.nan
    r = fa.check(q, k, v, out=out)
    assert not r and r["out"].nonfinite_mismatches == 1


def test_varlen_and_paged_checks():
    lq = [5, 9]
    cu = np.array([0, 5, 14], dtype=np.int32)
    q = np.random.default_rng(10).standard_normal((14, 4, 16)).astype(np.float32)
    k = np.random.default_rng(11).standard_normal((14, 2, 16)).astype(np.float32)
    v = np.random.default_rng(12).standard_normal((14, 2, 16)).astype(np.float32)
    out, lse = fa.attention_varlen(q, k, v, cu, cu, causal=True, return_lse=True)
    assert fa.check(q, k, v, out=out, lse=lse, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True)
    bad = out.copy()
    bad[lq[0]] += 0.1  # the first row of sequence 1
    r = fa.check(q, k, v, out=bad, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True)
    assert not r and r["out"].worst_index[0] == lq[0]
    table = np.array([[1, 0], [2, 3]], dtype=np.int32)
    used = np.array([5, 8], dtype=np.int32)
    kp = np.random.default_rng(13).standard_normal((4, 4, 2, 16)).astype(np.float32)
    vp = np.random.default_rng(14).standard_normal((4, 4, 2, 16)).astype(np.float32)
    qd = np.random.default_rng(15).standard_normal((2, 1, 4, 16)).astype(np.float32)
    outp = fa.attention_paged(qd, kp, vp, table, used)
    assert fa.check(qd, kp, vp, out=outp, block_table=table, seqused_k=used)


def test_assert_attention_close_raises_with_the_report():
    q, k, v = inputs(np.float32, seed=16)
    out, _ = kernel(q, k, v, causal=True)
    assert_attention_close(q, k, v, out=out, causal=True)
    wrong, _ = kernel(q, k, v, causal=True, bug="scale")
    with pytest.raises(AssertionError) as e:
        assert_attention_close(q, k, v, out=wrong, causal=True, msg="my kernel")
    text = str(e.value)
    assert text.startswith("my kernel") and "FAIL" in text and "rule:" in text


def test_candidate_of_the_wrong_shape_is_refused():
    q, k, v = inputs(np.float32, seed=17)
    with pytest.raises(fa.InvalidArgumentError, match="shape"):
        fa.check(q, k, v, out=np.zeros((2, 40, 4, 31), np.float32))


# ------------------------------------------------------------------ messages (issue 35)

def test_a_wider_candidate_fails_with_a_hint_at_dtype():
    """An f32 kernel's output returned as float64 FAILs against the float64 yardstick; the
    report says to pass dtype='float32', which PASSes it; the rule names both dtypes."""
    q, k, v = inputs(np.float32, seed=20)
    out, _ = kernel(q, k, v)
    r = fa.check(q, k, v, out=out.astype(np.float64))
    assert not r and "dtype='float32'" in r.hint and r.hint.startswith("out holds float64")
    assert "hint: out holds float64" in str(r) and "(conventional f64 error)" in r["out"].rule
    r = fa.check(q, k, v, out=out.astype(np.float64), dtype="float32")
    assert r and r.hint is None, str(r)
    assert "(conventional f32 error)" in r["out"].rule and "(f32 floor)" in r["out"].rule
    bad = out.copy()
    bad[0, 0, 0, 0] += 1
    r = fa.check(q, k, v, out=bad)
    assert not r and r.hint is None  # of the inputs' dtype: nothing to hint


def test_mixed_input_dtypes_are_refused():
    q, k, v = inputs(np.float32, seed=21)
    out, _ = kernel(q, k, v)
    with pytest.raises(fa.InvalidArgumentError, match="k: float64, but q is float32"):
        fa.check(q, k.astype(np.float64), v, out=out)
    with pytest.raises(fa.InvalidArgumentError, match="v: float64, but k is float32"):
        fa.check(q, k, v.astype(np.float64), out=out)
    with pytest.raises(fa.InvalidArgumentError, match="dout: float64, but q is float32"):
        fa.check(q, k, v, dout=np.zeros(q.shape), dq=q)
    k16, v16 = k.astype(np.float16), v.astype(np.float16)  # an f16 cache under f32 q: taken
    assert fa.check(q, k16, v16, out=fa.attention(q, k16, v16))


@pytest.mark.parametrize("change, message", [
    (lambda q, k, v: (q, k[..., :16], v), "k: head dim 16, but q has 32"),
    (lambda q, k, v: (q, np.concatenate([k, k[:, :, :1]], 2), v), "k: 3 heads, but v has 2"),
    (lambda q, k, v: (q, k, np.concatenate([v, v[:, :, :1]], 2)), "v: 3 heads, but k has 2"),
    (lambda q, k, v: (q, k, v[:, :30]), "v: sequence length 30, but k has 50"),
    (lambda q, k, v: (q, k[:1], v), "k: batch 1, but q has 2"),
    (lambda q, k, v: (q, k[:1], v[:1]), "q: batch 2, but k has 1"),
    (lambda q, k, v: (q, np.concatenate([k, k[:, :, :1]], 2), np.concatenate([v, v[:, :, :1]], 2)),
     "q: 4 heads, not a multiple of the 3 of k"),
])
def test_shape_errors_blame_the_input_at_fault(change, message):
    q, k, v = inputs(np.float32, seed=22)
    out, _ = kernel(q, k, v)
    with pytest.raises(fa.InvalidArgumentError, match=re.escape(message)) as e:
        fa.check(*change(q, k, v), out=out)
    assert "->" not in str(e.value)


def test_candidate_shapes_in_the_arrays_layout():
    q, k, v = inputs(np.float32, seed=23)
    out, lse = kernel(q, k, v)
    with pytest.raises(fa.InvalidArgumentError,
                       match=re.escape("lse: shape (2, 40, 4), but the inputs give (2, 4, 40), "
                                       "(batch, heads, seqlen); it looks like (batch, seqlen, "
                                       "heads)")):
        fa.check(q, k, v, lse=np.swapaxes(lse, 1, 2))
    with pytest.raises(fa.InvalidArgumentError,
                       match=re.escape("dk: shape (2, 50, 2, 31), but k gives (2, 50, 2, 32)")):
        fa.check(q, k, v, dout=out, dk=k[..., :31])


def test_worst_index_named_in_the_arrays_order():
    q, k, v = inputs(np.float32, seed=24)
    out, lse = kernel(q, k, v)
    out[1, 7, 3, 5] += 0.5
    lse[1, 3, 7] += 0.5
    r = fa.check(q, k, v, out=out, lse=lse)
    assert r["out"].index_names == ("batch", "seq", "head", "dim")
    assert r["lse"].worst_index == (1, 3, 7) and r["lse"].index_names == ("batch", "head", "seq")
    assert "[b=1,s=7,h=3,d=5]" in str(r) and "[b=1,h=3,s=7]" in str(r), str(r)
    rb = fa.check(*(np.swapaxes(x, 1, 2) for x in (q, k, v)), out=np.swapaxes(out, 1, 2),
                  layout="bhsd")["out"]
    assert rb.index_names == ("batch", "head", "seq", "dim") and "[b=1,h=3,s=7,d=5]" in str(rb)


def test_rel_error_is_relative_to_the_largest_reference():
    q, k, v = inputs(np.float32, seed=25)
    ref = fa.attention(q, k, v, backend="reference")
    out = ref.copy()
    at = np.unravel_index(np.argmin(np.abs(ref)), ref.shape)
    out[at] += 1e-3  # elementwise, relative to a reference near 0: huge
    t = fa.check(q, k, v, out=out)["out"]
    assert t.rel_error == pytest.approx(t.max_abs / np.abs(ref).max(), rel=1e-5)
    assert t.rel_error < 1e-2 and not hasattr(t, "max_rel")
    t = fa.check(q, k, np.zeros_like(v), out=np.zeros_like(out))["out"]
    assert t.rel_error is None and " -" in str(t)


def test_a_dout_of_another_shape_is_told_so():
    q, k, v = inputs(np.float32, seed=26)
    with pytest.raises(fa.InvalidArgumentError,
                       match=re.escape("dout: sequence length 10, but q has 40 (dout is shaped")):
        fa.check(q, k, v, dout=q[:, :10], dq=q)
    with pytest.raises(fa.InvalidArgumentError, match=re.escape("dout: head dim 16, but v has 32")):
        fa.check(q, k, v, dout=q[..., :16], dq=q)


def toward_zero(x, dt):
    """x rounded toward zero to dt (a truncating conversion)."""
    r = x.astype(dt)
    return np.where(np.abs(r.astype(np.float64)) > np.abs(x), np.nextafter(r, dt(0)), r)


def test_statistics_catch_what_the_max_hides():
    """float16 at 2^16 outputs: an output rounded by truncation passes the max rule and fails
    the least-squares scale (docs/DESIGN.md §4); rule="max" judges the max alone. The
    honest kernel passes every statistic."""
    q, k, v = inputs(np.float16, seed=3, b=1, sq=256, sk=256, hq=4, hk=4, d=64)
    out, _ = kernel(q, k, v, acc=np.float32)
    honest = fa.check(q, k, v, out=out)
    assert honest and all(ok for _, _, ok in honest["out"].statistics.values()), str(honest)
    exact, _ = kernel(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                      acc=np.float64)
    cut = toward_zero(exact, np.float16)
    report = fa.check(q, k, v, out=cut, dtype="float16")
    t = report["out"]
    assert not report and t.max_abs <= t.bound and not t.statistics["scale"][2], str(report)
    assert "stats:" in str(report) and "FAILED" in str(report)
    assert fa.check(q, k, v, out=cut, dtype="float16", rule="max"), "the max alone passes it"
    with pytest.raises(fa.InvalidArgumentError, match="rule='both'"):
        fa.check(q, k, v, out=cut, rule="both")


def test_lse_held_to_its_own_dtype():
    """float16 kernel, float32 LSE (docs/DESIGN.md §4): judged against the conventional path
    in float32 plus the allowance, not the float16 one. The honest blocked kernel's LSE passes;
    its LSE + 1e-3 (a denominator 0.1% off) fails, also under rule="max", whose float16
    yardstick would have let it through; an LSE saved as float16 keeps the float16 rule."""
    q, k, v = inputs(np.float16, seed=4, b=1, sq=256, sk=256, hq=4, hk=4, d=64)
    out, lse = kernel(q, k, v, acc=np.float32)
    r = fa.check(q, k, v, out=out, lse=lse)
    assert r and "conventional f32 error" in r["lse"].rule and "allowance" in r["lse"].rule, str(r)
    for rule in ("all", "max"):
        assert not fa.check(q, k, v, out=out, lse=lse + np.float32(1e-3), rule=rule)
    assert not fa.check(q, k, v, out=out, lse=lse + np.float32(np.log(2)))
    r = fa.check(q, k, v, out=out, lse=lse.astype(np.float16), rule="max")
    assert r and "allowance" not in r["lse"].rule and "f16 floor" in r["lse"].rule, str(r)
    # float32 inputs, the kernel's float16 out: the yardstick's inputs are rounded as its were
    q32, k32, v32 = inputs(np.float32, seed=5, b=1, sq=256, sk=256, hq=4, hk=4, d=64)
    out, lse = kernel(*(x.astype(np.float16) for x in (q32, k32, v32)), acc=np.float32)
    r = fa.check(q32, k32, v32, out=out, lse=lse)
    assert r, str(r)
