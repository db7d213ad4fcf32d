"""The numpy backend's own behaviour (its results are covered with every backend's in
test_backends.py)."""

from __future__ import annotations

import numpy as np
import pytest

import fbands


def test_a_long_array_goes_by_chunks_with_the_same_bits_and_little_memory():
    """issue 27, F15: the solver's temporaries are per chunk, so 2M float32 elements take
    their outputs and one chunk's temporaries, where one pass held a few hundred bytes an
    element (600 MB);
    chunked or not, the answer is the same bits, invalid elements and broadcasting
    included, and an invalid element is reported at its index in the whole array."""
    import tracemalloc

    from fbands._inputs import Request
    from fbands.backends import numpy_backend as nb

    kl = fbands.get("kl")
    rng = np.random.default_rng(5)
    n = 3 * nb.CHUNK + 17
    p = rng.uniform(0.0, 1.0, n)
    p[[5, nb.CHUNK + 3]] = [2.0, np.nan]
    delta = rng.uniform(0.01, 0.2, (1, n))
    for args in ((p, 0.05), (p.astype(np.float32), delta), (p[:, None], delta[:, :7])):
        request = Request(log=True, invalid="nan")
        got = nb.exact(kl, *args, request)
        want = nb._exact(kl, *args, request)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype
            assert g.tobytes() == w.tobytes()
    with pytest.raises(fbands.BandError, match=r"got 2\.0 at index \(5,\)"):
        fbands.bounds(p, 0.05, "kl", backend="numpy")
    big = np.full(2_000_000, 0.3, np.float32)
    tracemalloc.start()
    try:
        fbands.bounds(big, 0.05, "kl", backend="numpy")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * big.nbytes + 64 * 8 * nb.CHUNK  # outputs, 64 float64s of a chunk
