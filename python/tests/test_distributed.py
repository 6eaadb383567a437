"""flashattn.distributed (context parallelism over MPI through mpi4py). Run under mpirun:

    mpirun -np 2 python3 -m pytest -q python/tests/test_distributed.py

(alone it runs as one rank). Skipped without mpi4py or a library built --with-mpi
(FLASHATTN_LIBRARY names one). Every test is collective; each rank's verdict is combined
over the ranks before it asserts, so the ranks pass or fail together.
"""
import numpy as np
import pytest

mpi4py = pytest.importorskip("mpi4py")
from mpi4py import MPI  # noqa: E402

import flashattn  # noqa: E402
from flashattn import _native as N  # noqa: E402

if not hasattr(N.lib, "fa_cp_local_size"):
    pytest.skip("the library was built without --with-mpi", allow_module_level=True)

import flashattn.distributed as cp  # noqa: E402

COMM = MPI.COMM_WORLD
W, R = COMM.Get_size(), COMM.Get_rank()


def everywhere(ok: bool) -> bool:
    return COMM.allreduce(bool(ok), op=MPI.LAND)


def cut(x, shard):
    """This rank's rows of a (B, S, H, D) array, in the shard's order."""
    return np.concatenate([x[:, a:a + n] for a, n in shard.parts], axis=1)


def cut_lse(x, shard):
    return np.concatenate([x[:, :, a:a + n] for a, n in shard.parts], axis=2)


@pytest.mark.parametrize("cp_layout", ["contiguous", "zigzag"])
def test_local_size_is_the_layout(cp_layout):
    """The shards as the header defines them: chunk c of n is [floor(c S / n), ...)."""
    for ranks in (1, 2, 3, 5):
        for S in (0, 1, 7, 100):
            rows = []
            for r in range(ranks):
                s = cp.local_size(S, ranks=ranks, rank=r, cp_layout=cp_layout)
                chunks = [r] if cp_layout == "contiguous" else [r, 2 * ranks - 1 - r]
                n = ranks if cp_layout == "contiguous" else 2 * ranks
                want = tuple((c * S // n, (c + 1) * S // n - c * S // n) for c in chunks)
                assert s.parts == want and s.local == sum(c for _, c in want)
                rows += [i for a, c in s.parts for i in range(a, a + c)]
            assert sorted(rows) == list(range(S))
    with pytest.raises(flashattn.InvalidArgumentError):
        cp.local_size(10, ranks=2, rank=2)


@pytest.mark.parametrize("dtype,cp_layout,schedule_opts", [
    ("float32", "zigzag", dict(causal=True, sinks=[0.5, -0.25, 1.0, 0.0])),
    ("float64", "contiguous", dict(causal=True, alibi_slopes=[0.1, 0.2, 0.3, 0.4],
                                   dropout_p=0.1, seed=5)),
])
def test_matches_the_whole_sequence(dtype, cp_layout, schedule_opts):
    """A shard's out, lse, dq, dk, dv (and the sink gradient) are the rows of one call over the
    whole sequence."""
    S, Hq, Hk, D = 90, 4, 2, 16
    rng = np.random.default_rng(7)
    q, dout = (rng.standard_normal((2, S, Hq, D)).astype(dtype) for _ in range(2))
    k, v = (rng.standard_normal((2, S, Hk, D)).astype(dtype) for _ in range(2))
    sq = cp.local_size(S, COMM, cp_layout=cp_layout)
    out, lse = cp.attention(cut(q, sq), cut(k, sq), cut(v, sq), comm=COMM, cp_layout=cp_layout,
                            return_lse=True, **schedule_opts)
    grads = cp.attention_backward(cut(dout, sq), cut(q, sq), cut(k, sq), cut(v, sq), out, lse,
                                  comm=COMM, cp_layout=cp_layout, **schedule_opts)
    ref, rl = flashattn.attention(q, k, v, return_lse=True, **schedule_opts)
    rgrads = flashattn.attention_backward(dout, q, k, v, ref, rl, **schedule_opts)
    tol = 1e-5 if dtype == "float32" else 1e-12
    ok = np.allclose(out, cut(ref, sq), atol=tol) and np.allclose(lse, cut_lse(rl, sq), atol=tol)
    for i, (g, rg) in enumerate(zip(grads, rgrads)):
        rows = rg if i == 3 else cut(rg, sq)  # dsinks: the whole sequence's on every rank
        ok &= np.allclose(g, rows, atol=10 * tol, rtol=1e-4 if i == 3 else 0)
    assert everywhere(ok)


def test_a_bad_argument_raises_on_every_rank():
    """One rank's q with other heads: every rank raises, the message naming that rank."""
    S, D = 32, 8
    s = cp.local_size(S, COMM)
    heads = 3 if R == W - 1 and W > 1 else 2
    q = np.ones((1, s.local, heads, D), np.float32)
    kv = np.ones((1, s.local, 1, D), np.float32)
    try:
        cp.attention(q, kv, kv, comm=COMM, causal=True)
        raised = W == 1
    except flashattn.InvalidArgumentError as e:
        raised = W > 1 and f"rank {W - 1}" in str(e)
    assert everywhere(raised)


def test_arguments_checked_before_any_call():
    with pytest.raises(flashattn.InvalidArgumentError):
        cp.attention(np.ones((1, 4, 1, 8), np.float32), np.ones((1, 4, 1, 8), np.float32),
                     np.ones((1, 4, 1, 8), np.float32), comm=COMM, cp_layout="striped")
    with pytest.raises(TypeError):
        cp.attention(np.ones((1, 4, 1, 8), np.float32), np.ones((1, 4, 1, 8), np.float32),
                     np.ones((1, 4, 1, 8), np.float32), comm=object())
