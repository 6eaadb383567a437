"""Attention in float64 numpy, written from docs/DESIGN.md §1 alone (not from the library):
the yardstick of the package's tests. Arrays are BSHD; q (B, Sq, Hq, D), k and v (B, Sk, Hk,
D). Dropout is not modelled (its draws are the library's own Philox stream)."""
import numpy as np


def allowed(sq, sk, causal=False, window=(-1, -1), align="bottom-right", sink_tokens=0):
    """(Sq, Sk) boolean: key j allowed for row i (step 4); an int window is the left bound."""
    left, right = (window, -1) if isinstance(window, int) else window
    if causal:
        right = 0
    off = sk - sq if align == "bottom-right" else 0
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    ok = np.ones((sq, sk), dtype=bool)
    if left >= 0:
        ok &= (j >= i + off - left) | (j < sink_tokens)
    if right >= 0:
        ok &= j <= i + off + right
    return ok


def forward(q, k, v, *, causal=False, window=(-1, -1), align="bottom-right", scale=None,
            softcap=None, alibi_slopes=None, sinks=None, sink_tokens=0,
            score_order="softcap-then-alibi", bias=None):
    """(out (B, Sq, Hq, Dv), lse (B, Hq, Sq), p (B, Hq, Sq, Sk)) in float64. bias: None, or
    an additive bias broadcastable to (B, Hq, Sq, Sk), added to the scaled scores (step 2b,
    before softcap and ALiBi)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    g = hq // hk
    scale = 1 / np.sqrt(d) if scale is None else scale
    kk = np.repeat(k, g, axis=2)  # head h reads kv head h // g
    vv = np.repeat(v, g, axis=2)
    s = scale * np.einsum("bihd,bjhd->bhij", q, kk)
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    off = sk - sq if align == "bottom-right" else 0
    dist = np.abs(np.arange(sq)[:, None] + off - np.arange(sk)[None, :])
    bias = 0 if alibi_slopes is None else -np.asarray(alibi_slopes, np.float64)[None, :, None, None] * dist
    if score_order == "alibi-then-softcap":
        s = s + bias
        s = s if softcap is None else softcap * np.tanh(s / softcap)
    else:
        s = s if softcap is None else softcap * np.tanh(s / softcap)
        s = s + bias
    ok = allowed(sq, sk, causal, window, align, sink_tokens)
    s = np.where(ok, s, -np.inf)
    sink = (np.full(hq, -np.inf) if sinks is None else np.asarray(sinks, np.float64))
    sink = np.broadcast_to(sink[None, :, None], (b, hq, sq))
    m = np.maximum(np.max(s, axis=-1, initial=-np.inf), sink)
    live = np.isfinite(m)
    mm = np.where(live, m, 0)[..., None]
    e = np.exp(s - mm)
    den = e.sum(-1) + np.exp(sink - mm[..., 0])
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(live, mm[..., 0] + np.log(den), -np.inf)
        p = np.where(live[..., None], e / den[..., None], 0.0)
    out = np.einsum("bhij,bjhd->bihd", p, vv)
    return out, lse, p


def backward(dout, q, k, v, *, softcap=None, sinks=None, score_order="softcap-then-alibi",
             scale=None, **mask):
    """(dq, dk, dv, dsinks or None) in float64, from the forward's P."""
    q, k, v, dout = (np.asarray(x, dtype=np.float64) for x in (q, k, v, dout))
    b, sq, hq, d = q.shape
    hk = k.shape[2]
    g = hq // hk
    scale = 1 / np.sqrt(d) if scale is None else scale
    out, lse, p = forward(q, k, v, softcap=softcap, sinks=sinks, score_order=score_order,
                          scale=scale, **mask)
    kk, vv = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    dvv = np.einsum("bhij,bihd->bjhd", p, dout)
    dp = np.einsum("bihd,bjhd->bhij", dout, vv)
    di = np.einsum("bihd,bihd->bhi", dout, out)
    ds = p * (dp - di[..., None])
    if softcap is not None:  # d/dx c tanh(x / c) = 1 - tanh^2
        s = scale * np.einsum("bihd,bjhd->bhij", q, kk)
        if score_order == "alibi-then-softcap":
            raise NotImplementedError("the tests' backward takes softcap before ALiBi")
        ds = ds * (1 - np.tanh(s / softcap) ** 2)
    dq = scale * np.einsum("bhij,bjhd->bihd", ds, kk)
    dkk = scale * np.einsum("bhij,bihd->bjhd", ds, q)
    dk = dkk.reshape(b, -1, hk, g, d).sum(3)
    dv = dvv.reshape(b, -1, hk, g, v.shape[3]).sum(3)
    dsinks = None
    if sinks is not None:
        ps = np.exp(np.asarray(sinks, np.float64)[None, :, None] - lse)
        ps = np.where(np.isfinite(lse), ps, 0.0)
        dsinks = -(ps * di).sum(axis=(0, 2))
    return dq, dk, dv, dsinks
