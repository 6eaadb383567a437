"""The oracle against PyTorch's masked attention on a GPU: SDPA's kernels with a bool
attn_mask and with a float bias that takes a gradient, what each gives a row its mask masks
whole (printed: the profiles' empty_out rests on it), FlexAttention with a BlockMask, and
the CUDA backend on torch tensors with a mask. Skips without torch with CUDA."""
import numpy as np
import pytest

import flashattn as fa

try:
    import torch
except ImportError:
    torch = None

CUDA = torch is not None and torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not CUDA, reason="needs torch with CUDA")

MASKED_BACKENDS = ["EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"]


def _sdpa(backend, q, k, v, **kw):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(getattr(SDPBackend, backend)):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)


def _inputs(seed, b=2, h=4, sq=130, sk=150, d=64, dtype="bfloat16", grad=True):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    return [torch.randn(b, h, s, d, device="cuda", dtype=dt, generator=g, requires_grad=grad)
            for s in (sq, sk, sk)]


def _keep_mask(seed, b, sq, sk):
    """A (B, 1, Sq, Sk) key-padding and random mask, every row keeping some key."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    keep = torch.rand(b, 1, sq, sk, device="cuda", generator=g) > 0.3
    keep[..., 0] = True
    return keep


@pytest.mark.parametrize("backend", MASKED_BACKENDS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sdpa_bool_mask_passes_the_oracle(backend, dtype):
    q, k, v = _inputs(1, dtype=dtype)
    mask = _keep_mask(2, 2, 130, 150)
    try:
        out = _sdpa(backend, q, k, v, attn_mask=mask)
    except RuntimeError as e:  # a kernel that does not take this mask
        pytest.skip(f"{backend}: {e}")
    dout = torch.randn_like(out)
    out.backward(dout)
    r = fa.check(q.detach(), k.detach(), v.detach(), out=out.detach(), dout=dout, dq=q.grad,
                 dk=k.grad, dv=v.grad, layout="bhsd", profile="pytorch", attn_mask=mask)
    assert r, str(r)
    # the same kernel without the mask is not what the masked call computed
    bare = fa.check(q.detach(), k.detach(), v.detach(), out=out.detach(), layout="bhsd",
                    profile="pytorch")
    assert not bare


@pytest.mark.parametrize("backend", MASKED_BACKENDS)
def test_sdpa_float_bias_and_its_gradient(backend):
    q, k, v = _inputs(3)
    g = torch.Generator(device="cuda").manual_seed(4)
    bias = torch.randn(1, 4, 130, 150, device="cuda", dtype=torch.bfloat16, generator=g)
    bias.requires_grad_(True)
    try:
        out = _sdpa(backend, q, k, v, attn_mask=bias)
        dout = torch.randn_like(out)
        out.backward(dout)
    except RuntimeError as e:
        pytest.skip(f"{backend}: {e}")
    if bias.grad is None:
        pytest.skip(f"{backend}: no gradient for the bias")
    r = fa.check(q.detach(), k.detach(), v.detach(), out=out.detach(), dout=dout, dq=q.grad,
                 dk=k.grad, dv=v.grad, layout="bhsd", profile="pytorch", attn_mask=bias.detach())
    assert r, str(r)
    # the bias gradient against ours: the float64 reference, and the bf16 conventional path as
    # the yardstick (3x, the gradients' rule)
    host = [x.detach().float().cpu().numpy().astype(np.float64) for x in (q, k, v)]
    b64 = bias.detach().float().cpu().numpy().astype(np.float64)
    d64 = dout.float().cpu().numpy().astype(np.float64)
    o64, l64 = fa.attention(*host, layout="bhsd", attn_mask=b64, return_lse=True,
                            backend="reference")
    ref = fa.attention_backward(d64, *host, o64, l64, layout="bhsd", attn_mask=b64,
                                bias_grad=True, backend="reference")[-1]
    low = [x.detach().cpu() for x in (q, k, v)]
    ol, ll = fa.attention(*low, layout="bhsd", attn_mask=bias.detach().cpu(), return_lse=True,
                          backend="conventional")
    conv = fa.attention_backward(dout.cpu(), *low, ol, ll, layout="bhsd",
                                 attn_mask=bias.detach().cpu(), bias_grad=True,
                                 backend="conventional")[-1]
    got = bias.grad.float().cpu().numpy()
    err, base = np.abs(got - ref).max(), np.abs(np.asarray(conv) - ref).max()
    print(f"{backend}: dbias error {err:.3g}, conventional bf16 {base:.3g}")
    assert err <= 3 * base + 2 ** -8 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("backend", MASKED_BACKENDS)
def test_sdpa_fully_masked_row_under_the_pytorch_profile(backend):
    """SDPA's kernels disagree on a row the mask masks whole (printed: EMPTY_ROW), so the
    pytorch profile leaves it uncompared; the flashattn profile (O = 0) holds each kernel to
    its own convention."""
    q, k, v = _inputs(5, b=1, h=2, sq=16, sk=16, grad=False)
    mask = torch.ones(1, 1, 16, 16, dtype=torch.bool, device="cuda")
    mask[..., 3, :] = False
    try:
        out = _sdpa(backend, q, k, v, attn_mask=mask)
    except RuntimeError as e:
        pytest.skip(f"{backend}: {e}")
    row = out[0, :, 3].float()
    zero = bool((row == 0).all())
    kind = "NaN" if torch.isnan(row).all() else "0" if zero else "other"
    print(f"EMPTY_ROW {backend}: {kind}")
    assert fa.check(q, k, v, out=out, layout="bhsd", profile="pytorch", attn_mask=mask)
    assert bool(fa.check(q, k, v, out=out, layout="bhsd", profile="flashattn",
                         align="top-left", attn_mask=mask)) == zero


def test_flex_attention_block_mask_passes_the_oracle():
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    b, h, s, d = 2, 4, 512, 64

    def causal_dropped(bi, hi, qi, ki):  # causal, less every key block 2 of each 4
        return (qi >= ki) & ((ki // 128) % 4 != 2)

    bm = flex.create_block_mask(causal_dropped, b, h, s, s, device="cuda")
    q, k, v = _inputs(7, b=b, h=h, sq=s, sk=s, grad=False)
    out, lse = flex.flex_attention(q, k, v, block_mask=bm, return_lse=True)
    # the BlockMask leaves the element mask to mask_mod: causal is the window, block 2 of 4
    # the blocks it does not list (create_block_mask drops blocks mask_mod empties)
    r = fa.check(q, k, v, out=out, lse=lse, layout="bhsd", profile="flex", causal=True,
                 block_mask=bm)
    assert r, str(r)
    assert not fa.check(q, k, v, out=out, layout="bhsd", profile="flex", causal=True)


def test_cuda_backend_takes_a_mask_on_torch_tensors():
    q, k, v = _inputs(8, grad=False)
    mask = _keep_mask(9, 2, 130, 150)
    try:
        out = fa.attention(q, k, v, layout="bhsd", attn_mask=mask)
    except fa.BackendUnavailableError:
        pytest.skip("a library built without CUDA")
    assert out.is_cuda
    assert fa.check(q, k, v, out=out, layout="bhsd", attn_mask=mask)
