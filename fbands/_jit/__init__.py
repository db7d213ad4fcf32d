"""The numba side of fbands: real modules, compiled per divergence against generated leaves.

What depends on a divergence is small: its ``F`` in ``s = log r`` (near and far forms),
``F'``, the closed-form coefficients and a few constants.  :mod:`.codegen` writes those, and
only those, as the *leaves* module of the divergence.  Everything else is ordinary Python in
this package, read, linted and tested in place:

* :mod:`.prims`: the math names, small helpers and compile options every kernel shares;
* :mod:`.scalar`: the scalar form of the band solver (one element at a time), the twin of
  the array solver :func:`fbands._solver.solve`, and its parallel drivers;
* :mod:`.closed_pass`: the branch-free pass over an array from the closed forms.

:mod:`.loader` puts each divergence's leaves beside byte copies of :mod:`.scalar` and
:mod:`.closed_pass` in a package of the private cache directory, so that numba's on-disk
cache (keyed by file) holds one entry per divergence, and imports it.  Under
``NUMBA_DISABLE_JIT=1`` (or :func:`.loader.python_kernels`) the modules of this package
run as they are, in pure Python, against the same leaves.
"""
