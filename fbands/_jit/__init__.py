"""The numba side of fbands, all of it in one room: the numba backend (:mod:`.backend`, which
:mod:`fbands._dispatch` imports by name like every backend), the band tables' numba pass
(:mod:`.table_kernels`), the kernels' disk cache and threads; nothing outside this package
imports it except through the backend.  Its modules are real modules, compiled per
divergence against generated leaves.

What depends on a divergence is small: its ``F`` in ``s = log r`` (near and far forms),
``F'``, the closed-form coefficients and a few constants.  :mod:`.codegen` writes those, and
only those, as the *leaves* module of the divergence.  Everything else is ordinary Python in
this package, read, linted and tested in place:

* :mod:`.prims`: the math names, small helpers and compile options every kernel shares;
* :mod:`.scalar`: the scalar form of the band solver (one element at a time), the twin of
  the array solver :func:`fbands._solver.solve`, and its parallel drivers;
* :mod:`.closed_pass`: the branch-free pass over an array from the closed forms;
* :mod:`.table_kernels`: the scalar twin of the tables' array reader
  (:func:`fbands.tables.layout.read_array`), for the backend's table path.

Why the scalar twins stay (the solver's and the table reader's): on large CPU arrays they
take 5-9 ns a token where the same work through torch's array operations takes 100-200, and
the tests hold each twin to its array form (same branch, same iterations, same bits).

:mod:`.loader` puts each divergence's leaves beside byte copies of :mod:`.scalar` and
:mod:`.closed_pass` in a package of the private cache directory, so that numba's on-disk
cache (keyed by file) holds one entry per divergence, and imports it.  Under
``NUMBA_DISABLE_JIT=1`` (or :func:`.loader.python_kernels`) the modules of this package
run as they are, in pure Python, against the same leaves.
"""
