"""flashattn's entry points against float64 numpy (numpy_attention.py, written from
docs/DESIGN.md §1), in every dtype and layout; zero copies; bad input."""
import numpy as np
import pytest

import flashattn as fa
import numpy_attention as ref

try:
    import ml_dtypes
    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # CI installs it; a bare numpy skips the bfloat16 cases
    BF16 = None

# the error a dtype's rounding of inputs and outputs leaves, against float64 (f32 sums)
TOL = {np.float64: 1e-12, np.float32: 2e-6, np.float16: 2e-3, "bf16": 2e-2}


DTYPES = [
    pytest.param(np.float64, id="f64"),
    pytest.param(np.float32, id="f32"),
    pytest.param(np.float16, id="f16"),
    pytest.param("bf16", id="bf16", marks=pytest.mark.skipif(BF16 is None,
                                                            reason="needs ml_dtypes")),
]


def make(shape, dt, seed, lo=-1.0, hi=1.0):
    x = np.random.default_rng(seed).uniform(lo, hi, shape)
    return x.astype(BF16 if dt == "bf16" else dt)


def as64(x):
    return np.asarray(x, dtype=np.float64)


OPTIONS = [
    pytest.param({}, id="plain"),
    pytest.param({"causal": True}, id="causal"),
    pytest.param({"causal": True, "align": "top-left"}, id="causal-top-left"),
    pytest.param({"window": (5, 2)}, id="window"),
    pytest.param({"window": 4, "causal": True, "sink_tokens": 3}, id="sink-tokens"),
    pytest.param({"softcap": 1.5, "scale": 0.7}, id="softcap-scale"),
    pytest.param({"alibi_slopes": [0.5, 0.25, 0.125, 0.0625], "causal": True}, id="alibi"),
    pytest.param({"alibi_slopes": [0.5, 0.25, 0.125, 0.0625], "softcap": 2.0,
                  "score_order": "alibi-then-softcap"}, id="alibi-then-softcap"),
    pytest.param({"sinks": np.float32([0.5, -np.inf, -1.0, 2.0]), "causal": True}, id="sinks"),
]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("opts", OPTIONS)
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_forward_matches_numpy(dt, opts, layout):
    q, k, v = make((2, 13, 4, 16), dt, 1), make((2, 21, 2, 16), dt, 2), make((2, 21, 2, 8), dt, 3)
    want, want_lse, _ = ref.forward(as64(q), as64(k), as64(v), **opts)
    args = [np.swapaxes(x, 1, 2) if layout == "bhsd" else x for x in (q, k, v)]
    out, lse = fa.attention(*args, layout=layout, return_lse=True, **opts)
    if layout == "bhsd":
        out = np.swapaxes(out, 1, 2)
    assert out.dtype == q.dtype and out.shape == want.shape
    assert lse.dtype == (np.float64 if dt == np.float64 else np.float32)
    tol = TOL[dt]
    np.testing.assert_allclose(as64(out), want, atol=tol * 4, rtol=0)
    np.testing.assert_allclose(as64(lse), want_lse, atol=tol * 8, rtol=tol)


@pytest.mark.parametrize("backend", ["tiled", "reference", "conventional"])
def test_backends_agree(backend):
    q, k, v = make((1, 40, 4, 32), np.float32, 4), make((1, 40, 1, 32), np.float32, 5), \
        make((1, 40, 1, 32), np.float32, 6)
    want, _, _ = ref.forward(q, k, v, causal=True)
    out = fa.attention(q, k, v, causal=True, backend=backend, threads=1)
    np.testing.assert_allclose(out, want, atol=2e-6)


@pytest.mark.parametrize("dt", [np.float64, np.float32])
@pytest.mark.parametrize("opts", [
    pytest.param({}, id="plain"),
    pytest.param({"causal": True, "window": (7, 0)}, id="causal-window"),
    pytest.param({"softcap": 2.0}, id="softcap"),
    pytest.param({"sinks": np.float32([0.3, -0.7, 1.1, -np.inf]), "causal": True}, id="sinks"),
])
def test_backward_matches_numpy(dt, opts):
    q, k, v = make((2, 11, 4, 8), dt, 7), make((2, 17, 2, 8), dt, 8), make((2, 17, 2, 8), dt, 9)
    dout = make((2, 11, 4, 8), dt, 10)
    out, lse = fa.attention(q, k, v, return_lse=True, **opts)
    grads = fa.attention_backward(dout, q, k, v, out, lse, **opts)
    want = ref.backward(as64(dout), as64(q), as64(k), as64(v), **opts)
    tol = 1e-11 if dt == np.float64 else 2e-5
    for got, exp, name in zip(grads, want, ("dq", "dk", "dv", "dsinks")):
        assert got.shape == exp.shape, name
        np.testing.assert_allclose(as64(got), exp, atol=tol, err_msg=name)
    assert (len(grads) == 4) == ("sinks" in opts)


def test_sink_gradient_is_the_finite_difference():
    q, k, v = make((1, 6, 2, 8), np.float64, 11), make((1, 9, 1, 8), np.float64, 12), \
        make((1, 9, 1, 8), np.float64, 13)
    dout = make((1, 6, 2, 8), np.float64, 14)
    sinks = np.array([0.375, -0.875])  # sinks are float32: dyadic values and steps stay exact
    out, lse = fa.attention(q, k, v, sinks=sinks, return_lse=True)
    dsinks = fa.attention_backward(dout, q, k, v, out, lse, sinks=sinks)[3]
    h = 2.0 ** -12
    for i in range(2):
        up, dn = sinks.copy(), sinks.copy()
        up[i] += h
        dn[i] -= h
        fd = ((fa.attention(q, k, v, sinks=up) - fa.attention(q, k, v, sinks=dn)) * dout).sum()
        assert abs(dsinks[i] - fd / (2 * h)) < 1e-6


def test_dropout_is_the_reference_backends():
    q, k, v = make((1, 30, 2, 16), np.float64, 15), make((1, 30, 2, 16), np.float64, 16), \
        make((1, 30, 2, 16), np.float64, 17)
    a = fa.attention(q, k, v, dropout_p=0.3, seed=5, offset=2, backend="tiled")
    b = fa.attention(q, k, v, dropout_p=0.3, seed=5, offset=2, backend="reference")
    c = fa.attention(q, k, v, dropout_p=0.3, seed=6, offset=2, backend="tiled")
    np.testing.assert_allclose(a, b, atol=1e-12)
    assert np.abs(a - c).max() > 1e-3  # another seed, other draws


def test_merge_states_is_attention_over_all_keys():
    q, k, v = make((1, 5, 2, 8), np.float32, 18), make((1, 30, 2, 8), np.float32, 19), \
        make((1, 30, 2, 8), np.float32, 20)
    whole = fa.attention(q, k, v)
    parts = [fa.attention(q, k[:, a:b], v[:, a:b], return_lse=True) for a, b in ((0, 12), (12, 30))]
    out, lse = fa.merge_states([p[0] for p in parts], [p[1] for p in parts])
    np.testing.assert_allclose(out, whole, atol=2e-6)
    np.testing.assert_allclose(lse, fa.attention(q, k, v, return_lse=True)[1], atol=2e-6)


# ------------------------------------------------------------------ calls of sequences

def test_varlen_is_each_sequence_alone():
    lq, lk = [3, 0, 7, 1], [5, 4, 0, 9]
    cq, ck = np.cumsum([0] + lq).astype(np.int32), np.cumsum([0] + lk).astype(np.int64)
    q, k, v = make((cq[-1], 4, 16), np.float32, 21), make((ck[-1], 2, 16), np.float32, 22), \
        make((ck[-1], 2, 16), np.float32, 23)
    out, lse = fa.attention_varlen(q, k, v, cq, ck, causal=True, return_lse=True)
    assert out.shape == (cq[-1], 4, 16) and lse.shape == (4, cq[-1])
    dout = make(out.shape, np.float32, 24)
    dq, dk, dv = fa.attention_varlen_backward(dout, q, k, v, out, lse, cq, ck, causal=True)
    for s in range(4):
        qs, ks = slice(cq[s], cq[s + 1]), slice(ck[s], ck[s + 1])
        o1, l1 = fa.attention(q[None, qs], k[None, ks], v[None, ks], causal=True,
                              return_lse=True)
        assert np.array_equal(o1[0], out[qs]) and np.array_equal(l1[0], lse[:, qs])
        g = fa.attention_backward(dout[None, qs], q[None, qs], k[None, ks], v[None, ks], o1, l1,
                                  causal=True)
        assert np.array_equal(g[0][0], dq[qs])
        assert np.array_equal(g[1][0], dk[ks]) and np.array_equal(g[2][0], dv[ks])


@pytest.mark.parametrize("kv_layout", ["nhd", "hnd"])
def test_paged_is_contiguous(kv_layout):
    page, lens = 3, np.array([7, 1, 11], dtype=np.int32)
    b, hk, d, maxp = 3, 2, 16, 4
    k, v = make((b, 12, hk, d), np.float32, 25), make((b, 12, hk, d), np.float32, 26)
    q = make((b, 2, 4, d), np.float32, 27)
    rng = np.random.default_rng(3)
    order = rng.permutation(b * maxp)
    table = order.reshape(b, maxp).astype(np.int32)
    kp = np.zeros((b * maxp, page, hk, d), np.float32)
    vp = np.zeros_like(kp)
    for s in range(b):
        for j in range(lens[s]):
            kp[table[s, j // page], j % page] = k[s, j]
            vp[table[s, j // page], j % page] = v[s, j]
    if kv_layout == "hnd":
        kp, vp = np.ascontiguousarray(kp.transpose(0, 2, 1, 3)), np.ascontiguousarray(vp.transpose(0, 2, 1, 3))
    out = fa.attention_paged(q, kp, vp, table, lens, kv_layout=kv_layout, causal=True)
    for s in range(b):
        want = fa.attention(q[s:s + 1], k[s:s + 1, :lens[s]], v[s:s + 1, :lens[s]], causal=True)
        assert np.array_equal(out[s:s + 1], want)


def test_kvcache_appends_then_attends():
    b, hk, d, cap = 2, 2, 8, 10
    kc, vc = np.zeros((b, cap, hk, d), np.float32), np.zeros((b, cap, hk, d), np.float32)
    lens = np.array([3, 5], dtype=np.int32)
    old_k, old_v = make((b, cap, hk, d), np.float32, 28), make((b, cap, hk, d), np.float32, 29)
    kc[:], vc[:] = old_k, old_v
    kn, vn = make((b, 2, hk, d), np.float32, 30), make((b, 2, hk, d), np.float32, 31)
    q = make((b, 2, 4, d), np.float32, 32)
    out = fa.attention_kvcache(q, kc, vc, k_new=kn, v_new=vn, cache_seqlens=lens, causal=True)
    for s in range(b):
        n = lens[s]
        assert np.array_equal(kc[s, n:n + 2], kn[s]) and np.array_equal(vc[s, n:n + 2], vn[s])
        assert np.array_equal(kc[s, :n], old_k[s, :n])
        want = fa.attention(q[s:s + 1], kc[s:s + 1, :n + 2], vc[s:s + 1, :n + 2], causal=True)
        assert np.array_equal(out[s:s + 1], want)
    full = np.array([9, 5], dtype=np.int32)  # sequence 0 has no room for 2 more
    before = kc.copy()
    with pytest.raises(fa.InvalidArgumentError):
        fa.append_kv(kn, vn, kc, vc, full)
    assert np.array_equal(kc, before)


# ------------------------------------------------------------------ no copies

def test_inputs_are_read_where_they_lie():
    big = make((2, 9, 8, 32), np.float32, 33)
    q = big[:, :, ::2]  # every other head: strided, not contiguous
    k = np.ascontiguousarray(big[:, :, 1:3])
    v = np.swapaxes(make((2, 2, 9, 32), np.float32, 37), 1, 2)  # BHSD storage seen as BSHD
    out = np.empty((2, 9, 4, 32), np.float32)
    res = fa.attention(q, k, v, out=out)
    assert res is out
    seen = fa._api.last_call
    assert seen["q"].data == q.__array_interface__["data"][0]
    assert seen["q"].head_stride == 2 * 32 and seen["k"].data == k.__array_interface__["data"][0]
    assert seen["v"].data == v.__array_interface__["data"][0] and seen["v"].seq_stride == 32
    assert seen["out"].data == out.__array_interface__["data"][0]
    want = fa.attention(np.ascontiguousarray(q), k, v)
    assert np.array_equal(out, want)


# ------------------------------------------------------------------ bad input

def qkv(dt=np.float32):
    return make((1, 4, 2, 8), dt, 34), make((1, 4, 2, 8), dt, 35), make((1, 4, 2, 8), dt, 36)


@pytest.mark.parametrize("mutate, exc, says", [
    (lambda a: dict(q=a["q"][..., ::2]), fa.InvalidArgumentError, "headdim_stride"),
    (lambda a: dict(k=a["k"].astype(np.float64)), fa.InvalidArgumentError, "dtype"),
    (lambda a: dict(q=a["q"][0]), fa.InvalidArgumentError, "q: expected 4 dims"),
    (lambda a: dict(v=a["v"][:, :3]), fa.InvalidArgumentError, "v->seqlen"),
    (lambda a: dict(scale=0.0), fa.InvalidArgumentError, "scale"),
    (lambda a: dict(window=(2 ** 64 - 1, 0)), fa.InvalidArgumentError, "window[0]"),
    (lambda a: dict(threads=-1), fa.InvalidArgumentError, "threads"),
    (lambda a: dict(layout="sbhd"), fa.InvalidArgumentError, "layout"),
    (lambda a: dict(window="left"), fa.InvalidArgumentError, "window"),
    (lambda a: dict(softcap=-1.0), fa.InvalidArgumentError, "softcap"),
    (lambda a: dict(align="middle"), fa.InvalidArgumentError, "align"),
    (lambda a: dict(backend="magic"), fa.InvalidArgumentError, "backend"),
    (lambda a: dict(dropout_p=1.0), fa.InvalidArgumentError, "dropout_p"),
    (lambda a: dict(alibi_slopes=[1.0]), fa.InvalidArgumentError, "alibi_slopes"),
    (lambda a: dict(sinks=[1.0, 2.0, 3.0]), fa.InvalidArgumentError, "sinks"),
    (lambda a: dict(q=a["q"].astype(np.int32)), TypeError, "dtype"),
    (lambda a: dict(q=[[1.0]]), TypeError, "expected an array"),
    (lambda a: dict(out=np.full((1, 4, 2, 7), 7.0, np.float32)), fa.InvalidArgumentError, "out"),
])
def test_bad_input_raises_and_writes_nothing(mutate, exc, says):
    q, k, v = qkv()
    args = dict(q=q, k=k, v=v, out=np.full((1, 4, 2, 8), 7.0, np.float32))
    args.update(mutate(args))
    out = args["out"]
    before = out.copy()
    with pytest.raises(exc) as e:
        fa.attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)
    assert says in str(e.value), str(e.value)
    assert out.tobytes() == before.tobytes()  # bit for bit: NaN patterns too


def test_read_only_output_refused():
    q, k, v = qkv()
    out = np.zeros((1, 4, 2, 8), np.float32)
    out.flags.writeable = False
    with pytest.raises(fa.InvalidArgumentError, match="read-only"):
        fa.attention(q, k, v, out=out)


def test_errors_carry_the_status():
    q, k, v = qkv()
    with pytest.raises(fa.FlashAttnError) as e:
        fa.attention(q, k, v, window=(-3, 0))
    assert e.value.status == 2 and isinstance(e.value, ValueError)  # FA_ERR_INVALID_ARGUMENT
    kk, vv = k.astype(np.float16), v.astype(np.float16)
    out, lse = fa.attention(q, kk, vv, return_lse=True)  # a cache dtype: forward only
    with pytest.raises(fa.UnsupportedError, match="forward only"):
        fa.attention_backward(out, q, kk, vv, out, lse)


def test_names_are_the_librarys():
    """The package's backend and ISA names map to the enum values the C library gives those
    names (an enumerator appended there, and not here, or here under another value, is
    caught)."""
    from flashattn import _native as N
    for table, name_of in ((N.BACKENDS, N.lib.fa_backend_name), (N.ISAS, N.lib.fa_isa_name)):
        for name, value in table.items():
            assert name_of(value).decode() == name, (name, value)
        assert name_of(len(table)).decode() == "invalid", name_of(len(table))


def test_help_reads_like_the_header():
    doc = fa.attention.__doc__
    for word in ("bottom-right", "window", "sinks", "InvalidArgumentError", "bhsd"):
        assert word in doc


def test_the_gil_is_released_during_a_call():
    """While one thread is inside a long call, another runs Python: the call holds no GIL.
    Held, the other thread would run only until its switch interval ran out (5 ms) and not
    again until the call returned; so it must be seen running in the middle of the call."""
    import threading
    import time
    q = make((1, 1024, 8, 64), np.float32, 38)
    k, v = make((1, 1024, 8, 64), np.float32, 39), make((1, 1024, 8, 64), np.float32, 40)
    fa.attention(q, k, v, backend="reference", threads=1)  # the context, made once
    seen, done = [], threading.Event()

    def tick():
        while not done.is_set():
            seen.append(time.perf_counter())
            for _ in range(1000):
                pass

    t = threading.Thread(target=tick)
    t.start()
    time.sleep(0.01)
    t0 = time.perf_counter()
    fa.attention(q, k, v, backend="reference", threads=1)
    t1 = time.perf_counter()
    done.set()
    t.join()
    assert t1 - t0 > 0.05, t1 - t0
    lo, hi = t0 + 0.3 * (t1 - t0), t0 + 0.7 * (t1 - t0)
    assert any(lo <= x <= hi for x in seen), "no Python ran in the middle of the call"


def poisoned_when_freed(a):
    """A copy of a whose memory is filled with NaN bytes as it is freed."""
    import ctypes
    n = a.nbytes

    class Buffer(ctypes.c_char * n):
        def __del__(self):
            ctypes.memset(ctypes.addressof(self), 0xFF, n)

    buf = Buffer()
    copy = np.frombuffer(buf, dtype=a.dtype).reshape(a.shape)
    copy[...] = a
    return copy


class CopyingProducer:
    """A DLPack producer that exports a fresh copy each time, as DLPack allows: the copy lives
    as long as the capsule, so the package must keep every capsule until the call is over
    (a view dropped early once put v_new's values into the K cache)."""

    def __init__(self, a):
        self.a = a

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()

    def __dlpack__(self, stream=None):
        return poisoned_when_freed(self.a).__dlpack__()


def test_dlpack_capsules_live_until_the_call_is_over():
    q = make((2, 5, 4, 8), np.float32, 43)
    k, v = make((2, 7, 2, 8), np.float32, 44), make((2, 7, 2, 8), np.float32, 45)
    dout = make((2, 5, 4, 8), np.float32, 46)
    out, lse = fa.attention(q, k, v, causal=True, return_lse=True)
    want = fa.attention_backward(dout, q, k, v, out, lse, causal=True)
    for _ in range(3):  # fresh copies each time, freed as soon as nothing holds them
        got = fa.attention_backward(*(CopyingProducer(x) for x in (dout, q, k, v, out, lse)),
                                    causal=True)
        for g, w in zip(got, want):
            assert np.array_equal(g, w)


def test_statuses_raise_their_exception_classes():
    """Each failing status raises its class (with the library's status name in the message);
    a communication failure is no caller's bad argument: CommunicationError, a RuntimeError."""
    from flashattn import _native as N
    classes = {N.FA_ERR_SHAPE: fa.InvalidArgumentError, N.FA_ERR_UNSUPPORTED: fa.UnsupportedError,
               N.FA_ERR_NO_MEMORY: fa.OutOfMemoryError, N.FA_ERR_DEVICE: fa.DeviceError,
               N.FA_ERR_COMMUNICATION: fa.CommunicationError}
    for status, cls in classes.items():
        with pytest.raises(cls, match="call: " + N.lib.fa_status_string(status).decode()):
            N.check_status(status, "call")
    assert issubclass(fa.CommunicationError, RuntimeError)
    assert not issubclass(fa.CommunicationError, ValueError)
