"""The band tables: for one divergence at one scalar radius, polynomials of both edges on
short cells of ``z = min(p, 1 - p)``, read instead of solving.

* :mod:`.layout`: the one definition of how a table is encoded and read (cells, rows, the
  element's ``z`` and coordinate);
* :mod:`.build`: rows fitted and validated against the exact solver, cell by cell
  (:class:`~.build.TableSet`);
* :mod:`.store`: complete tables on disk, verified, for later processes;
* :mod:`.cache`: the one in-memory cache of them (:data:`~.cache.TABLES`);
* :mod:`.kernels`: the numba pass that reads them; :mod:`.torch_reader`: the same reading in
  torch operations, on any device.

The backends read tables through these modules; nothing here imports a backend's entry
point or :mod:`fbands.bands`.
"""
