"""ggml's block caches (kv_dtype="q8_0" / "q4_0"): k and v as uint8 arrays of blocks give the
bits of float32 arrays holding their values (the blocks written here from the format's
definition, not the library's code), on the decode path and the tiles, numpy and torch arrays;
bad arrays and names are refused naming the argument."""
import numpy as np
import pytest

import flashattn as fa

try:
    import torch
except ImportError:
    torch = None

BYTES = {"q8_0": 34, "q4_0": 18}


def blocks(fmt, n, rng):
    """n random blocks (bytes, n x 34 or 18) and their values (n x 32, float32): an f16 scale
    d, then int8 codes q (value d q) or 16 bytes of nibbles (element j < 16 the low nibble u of
    byte j, j >= 16 the high nibble of byte j - 16; value d (u - 8))."""
    d = (rng.uniform(0.5, 2, n) * 2.0 ** rng.integers(-6, 0, n)).astype(np.float16)
    if fmt == "q8_0":
        q = rng.integers(-128, 128, (n, 32)).astype(np.int8)
        codes, vals = q.view(np.uint8), q.astype(np.float32)
    else:
        u = rng.integers(0, 16, (n, 32)).astype(np.uint8)
        codes, vals = u[:, :16] | (u[:, 16:] << 4), u.astype(np.float32) - 8
    return (np.concatenate([d.view(np.uint8).reshape(n, 2), codes], axis=1),
            d.astype(np.float32)[:, None] * vals)


def cache(fmt, b, s, h, d, rng):
    raw, vals = blocks(fmt, b * s * h * d // 32, rng)
    return raw.reshape(b, s, h, d // 32 * BYTES[fmt]), vals.reshape(b, s, h, d)


@pytest.mark.parametrize("sq,hq", [(1, 8), (33, 2)])  # the decode path, the tiles
@pytest.mark.parametrize("formats", [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "q4_0")])
def test_blocks_read_as_their_values(sq, hq, formats):
    rng = np.random.default_rng(7)
    b, sk, hk, d = 2, 200, 2, 64
    (kb, kf), (vb, vf) = (cache(fmt, b, sk, hk, d, rng) for fmt in formats)
    q = rng.standard_normal((b, sq, hq, d)).astype(np.float32)
    kv = formats[0] if formats[0] == formats[1] else formats
    out, lse = fa.attention(q, kb, vb, kv_dtype=kv, causal=True, return_lse=True)
    want, want_lse = fa.attention(q, kf, vf, causal=True, return_lse=True)
    assert out.tobytes() == want.tobytes() and lse.tobytes() == want_lse.tobytes()


@pytest.mark.skipif(torch is None, reason="needs PyTorch")
def test_torch_uint8_blocks():
    rng = np.random.default_rng(8)
    (kb, kf), (vb, vf) = cache("q8_0", 1, 100, 2, 64, rng), cache("q4_0", 1, 100, 2, 64, rng)
    q = rng.standard_normal((1, 1, 4, 64)).astype(np.float32)
    out = fa.attention(torch.from_numpy(q), torch.from_numpy(kb), torch.from_numpy(vb),
                       kv_dtype=("q8_0", "q4_0"))
    assert isinstance(out, torch.Tensor)
    assert out.numpy().tobytes() == fa.attention(q, kf, vf).tobytes()


def test_bad_block_arrays_and_names():
    rng = np.random.default_rng(9)
    kb, kf = cache("q8_0", 1, 50, 2, 64, rng)
    q = rng.standard_normal((1, 1, 4, 64)).astype(np.float32)
    with pytest.raises(fa.InvalidArgumentError, match="k: a row of 68 bytes is not whole q4_0"):
        fa.attention(q, kb, kb, kv_dtype="q4_0")
    with pytest.raises(TypeError, match="k: kv_dtype q8_0 reads the blocks' bytes"):
        fa.attention(q, kf, kb, kv_dtype="q8_0")
    wide = np.zeros((1, 50, 2, 70), np.uint8)
    wide[..., :68] = kb
    with pytest.raises(fa.InvalidArgumentError, match="v: strides .* whole blocks"):
        fa.attention(q, kb, wide[..., :68], kv_dtype="q8_0")
    for bad in ("q5_0", ("q8_0",), 3):
        with pytest.raises(fa.InvalidArgumentError, match="kv_dtype="):
            fa.attention(q, kb, kb, kv_dtype=bad)
    with pytest.raises(fa.InvalidArgumentError, match="dtype"):  # the library: f64 q
        fa.attention(q.astype(np.float64), kb, kb, kv_dtype="q8_0")
