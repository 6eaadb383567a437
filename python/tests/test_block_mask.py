"""block_mask (fa_params.block_mask): FlexAttention's BlockMask as flashattn.BlockMask arrays or
as torch's own object; the same keys as the dense keep-mask it stands for, bitwise on the tiled
backend, forward and backward; broadcast batch and heads, full lists, refusals naming
block_mask, and the oracle under profile "flex" (torch's flex_attention on the CPU where it
runs)."""
import numpy as np
import pytest

import flashattn as fa

B, SQ, SK, H, HK, D = 2, 100, 140, 4, 2, 16
QB, KB = 32, 16
NQ, NK = -(-SQ // QB), -(-SK // KB)  # 4 query blocks, 9 key blocks


def qkv(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, SQ, H, D)).astype(np.float32),
            rng.standard_normal((B, SK, HK, D)).astype(np.float32),
            rng.standard_normal((B, SK, HK, D)).astype(np.float32))


def blocks(seed, density, b=B, h=H, full=False, dtype=np.int32):
    """A random BlockMask (each query block lists each key block with probability density,
    in random order; with full, the listed blocks split at random between the two lists;
    entries past a row's count out of range, never read) and its dense keep-mask (b, h, SQ,
    SK)."""
    rng = np.random.default_rng(seed)
    listed = rng.random((b, h, NQ, NK)) < density
    in_full = listed & (rng.random(listed.shape) < 0.5) if full else np.zeros_like(listed)
    lists = []
    for part in (listed & ~in_full, in_full):
        num = part.sum(-1).astype(dtype)
        idx = np.full(part.shape, NK + 7, dtype)
        for at in np.ndindex(*part.shape[:3]):
            cols = rng.permutation(np.flatnonzero(part[at]))
            idx[at][:len(cols)] = cols
        lists += [num, idx]
    keep = np.repeat(np.repeat(listed, QB, axis=2), KB, axis=3)[:, :, :SQ, :SK]
    return fa.BlockMask(*lists[:2], *(lists[2:] if full else (None, None)), QB, KB), keep


def forward_backward(q, k, v, **mask):
    out, lse = fa.attention(q, k, v, return_lse=True, backend="tiled", **mask)
    dout = np.random.default_rng(9).standard_normal(out.shape).astype(np.float32)
    return (out, lse) + fa.attention_backward(dout, q, k, v, out, lse, backend="tiled", **mask)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("density", [0.0, 0.1, 0.3, 0.5, 0.8, 1.0])
def test_block_mask_is_its_dense_mask_bitwise(density, causal):
    q, k, v = qkv(1)
    bm, keep = blocks(2, density)
    got = forward_backward(q, k, v, causal=causal, block_mask=bm)
    want = forward_backward(q, k, v, causal=causal, attn_mask=keep)
    for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        assert np.array_equal(g, w), name
    if density == 0:  # every row empty
        assert (got[0] == 0).all() and (got[1] == -np.inf).all()


@pytest.mark.parametrize("b, h", [(1, H), (B, 1), (1, 1)])
def test_broadcast_batch_and_heads(b, h):
    q, k, v = qkv(3)
    small, keep = blocks(4, 0.5, b=b, h=h)
    full = fa.BlockMask(*(np.ascontiguousarray(np.broadcast_to(a, (B, H) + a.shape[2:]))
                          for a in (small.kv_num_blocks, small.kv_indices)), q_block=QB,
                        kv_block=KB)
    want = forward_backward(q, k, v, attn_mask=keep)
    for bm in (small, full):
        for g, w in zip(forward_backward(q, k, v, block_mask=bm), want):
            assert np.array_equal(g, w)


def test_full_lists_are_the_same_keys():
    q, k, v = qkv(5)
    bm, keep = blocks(6, 0.6, full=True, dtype=np.int64)
    assert bm.full_kv_num_blocks.sum() > 0 and bm.kv_num_blocks.sum() > 0
    for g, w in zip(forward_backward(q, k, v, block_mask=bm),
                    forward_backward(q, k, v, attn_mask=keep)):
        assert np.array_equal(g, w)


def _bad_masks():
    bm, _ = blocks(7, 1.0)
    num, idx = bm.kv_num_blocks, bm.kv_indices
    out_of_range = idx.copy()
    out_of_range[1, 2, 3, 0] = NK
    repeated = idx.copy()
    repeated[0, 1, 2, 1] = repeated[0, 1, 2, 0]
    return {
        "index out of range": fa.BlockMask(num, out_of_range, q_block=QB, kv_block=KB),
        "negative index": fa.BlockMask(num, np.where(idx == 4, -1, idx), q_block=QB,
                                       kv_block=KB),
        "repeated block": fa.BlockMask(num, repeated, q_block=QB, kv_block=KB),
        "repeated across the lists": fa.BlockMask(num, idx, num, idx, QB, KB),
        "count past the key blocks": fa.BlockMask(num + 1, idx, q_block=QB, kv_block=KB),
        "kv_indices 3-D": fa.BlockMask(num, idx[..., 0], q_block=QB, kv_block=KB),
        "one query block too many": fa.BlockMask(np.concatenate([num, num[..., :1]], -1),
                                                 np.concatenate([idx, idx[:, :, :1]], 2),
                                                 q_block=QB, kv_block=KB),
        "q_block not Sq's blocks": fa.BlockMask(num, idx, q_block=64, kv_block=KB),
        "batch 3": fa.BlockMask(num[[0, 1, 1]], idx[[0, 1, 1]], q_block=QB, kv_block=KB),
        "full list of another shape": fa.BlockMask(num, idx, num[:, :1], idx[:, :1], QB, KB),
        "full count without indices": fa.BlockMask(num, idx, num, None, QB, KB),
        "block size 0": fa.BlockMask(num, idx, q_block=0, kv_block=KB),
        "not a block mask": object(),
    }


@pytest.mark.parametrize("case", list(_bad_masks()))
def test_bad_block_masks_are_refused_by_name(case):
    bm = _bad_masks()[case]
    q, k, v = qkv(8)
    out = np.full((B, SQ, H, D), 7.0, np.float32)
    with pytest.raises(fa.InvalidArgumentError, match="block_mask"):
        fa.attention(q, k, v, block_mask=bm, out=out, backend="tiled")
    assert (out == 7).all()  # nothing written
    with pytest.raises(fa.InvalidArgumentError, match="block_mask"):
        fa.check(q, k, v, out=out, block_mask=bm)


def test_float_indices_are_a_type_error():
    bm, _ = blocks(9, 0.5)
    bm.kv_indices = bm.kv_indices.astype(np.float32)
    with pytest.raises(TypeError, match="block_mask.kv_indices"):
        fa.attention(*qkv(9), block_mask=bm)


@pytest.mark.parametrize("full", [False, True])
def test_check_takes_the_block_mask(full):
    """A kernel that honours the mask passes under profile flex (top-left causal), one that
    ignores it fails; forward and gradients."""
    q, k, v = qkv(10)
    bm, _ = blocks(11, 0.5, full=full)
    mask = dict(causal=True, align="top-left")
    out, lse, dq, dk, dv = forward_backward(q, k, v, block_mask=bm, **mask)
    dout = np.random.default_rng(9).standard_normal(out.shape).astype(np.float32)
    cands = dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv, dout=dout)
    r = fa.check(q, k, v, profile="flex", causal=True, block_mask=bm, **cands)
    assert r, str(r)
    bare = forward_backward(q, k, v, **mask)
    for n, x in zip(("out", "lse", "dq", "dk", "dv"), bare):
        r = fa.check(q, k, v, profile="flex", causal=True, block_mask=bm, dout=dout, **{n: x})
        assert not r, f"{n}: the candidate without the block mask passed\n{r}"


def _flex():
    """torch's flex_attention module where torch is installed with it, else skip."""
    pytest.importorskip("torch")
    return pytest.importorskip("torch.nn.attention.flex_attention")


def test_torch_flex_attention_on_the_cpu_passes_the_oracle():
    flex = _flex()
    import torch
    b, h, sq, sk, d = 2, 4, 200, 256, 32

    def causal(bi, hi, qi, ki):
        return qi >= ki

    g = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(b, h, s, d, generator=g) for s in (sq, sk, sk))
    try:
        bm = flex.create_block_mask(causal, b, None, sq, sk, device="cpu", BLOCK_SIZE=64)
        out, lse = flex.flex_attention(q, k, v, block_mask=bm, return_lse=True)
    except (RuntimeError, NotImplementedError, AssertionError, TypeError) as e:
        pytest.skip(f"flex_attention does not run on this CPU: {e}")
    assert bm.full_kv_num_blocks is not None and int(bm.full_kv_num_blocks.sum()) > 0
    r = fa.check(q, k, v, out=out, lse=lse, layout="bhsd", profile="flex", causal=True,
                 block_mask=bm)
    assert r, str(r)
    # torch's object and its tensors as a flashattn.BlockMask: the same bits
    arrays = fa.BlockMask(bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks,
                          bm.full_kv_indices, *bm.BLOCK_SIZE)
    ours = fa.attention(q, k, v, layout="bhsd", causal=True, align="top-left", block_mask=bm)
    assert torch.equal(ours, fa.attention(q, k, v, layout="bhsd", causal=True,
                                          align="top-left", block_mask=arrays))
    # a listed block is a hint, never a permission: the diagonal's partial blocks need causal
    assert not fa.check(q, k, v, out=out, layout="bhsd", profile="flex", block_mask=bm)
