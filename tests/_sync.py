"""A host-synchronisation detector and aten op counter for tests, on any device.

:class:`SyncDetector` is a ``TorchDispatchMode``: every aten op that runs inside it is
recorded, and the ones that make the host wait for a CUDA device are flagged:

* ``aten._local_scalar_dense`` (what ``.item()``, ``bool(t)``, ``int(t)``, ``float(t)``
  reduce to), ``aten.is_nonzero``, ``aten.equal`` (both answer a Python bool);
* ops whose output size depends on the values: ``aten.nonzero`` (not
  ``nonzero_static``), ``aten.masked_select``, ``aten.unique*``, ``aten.bincount``,
  ``aten.repeat_interleave`` with a tensor of repeats and no ``output_size``, and boolean
  mask indexing (``aten.index`` / ``aten.index_put*`` with a bool or uint8 index);
* copies between the host and a device (``aten._to_copy`` / ``aten.copy_`` with one side on
  the CPU and the other not): a device-to-host copy waits for the device, and so does a
  host-to-device copy from pageable memory (``non_blocking=False``).

Reads that bypass the dispatcher on CPU tensors (``Tensor.tolist``, ``Tensor.numpy``,
``Tensor.__array__`` for ``np.asarray``, and ``Tensor.cpu``, which on a device tensor
is a device-to-host copy) are caught by wrapping those methods while the detector is
active; a read counts once, however it dispatches inside.  On the CPU every such read is
counted, since it is a host read on a device.  Separately, ``uploads`` lists the tensors
built from host data (``aten.lift_fresh`` of ``torch.tensor([...])`` with at least one
dimension), which on a device is a blocking host-to-device copy each time.

Each finding carries the innermost stack frame outside torch, the code that asked for the
op, and whether that code is fbands' own, so that a test can tell a sync of fbands from
one of the engine (TRL, verl, transformers) that it calls or that calls it.

Example::

    with SyncDetector() as det:
        loss.backward()
    assert det.syncs == [], det.report()
    print(det.op_count)
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import threading
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# Ops that answer a Python value, or whose output size depends on the values.
_SYNC_PACKETS = {
    aten._local_scalar_dense: "reads a scalar on the host",
    aten.is_nonzero: "reads a bool on the host",
    aten.equal: "reads a bool on the host",
    aten.nonzero: "output size depends on the values",
    aten.masked_select: "output size depends on the values",
    aten.bincount: "output size depends on the values",
    aten._unique: "output size depends on the values",
    aten._unique2: "output size depends on the values",
    aten.unique_dim: "output size depends on the values",
    aten.unique_consecutive: "output size depends on the values",
    aten.unique_dim_consecutive: "output size depends on the values",
}
_INDEX_PACKETS = {aten.index, aten.index_put_, aten.index_put, aten._index_put_impl_}
_METHODS = ("tolist", "numpy", "__array__", "cpu")

_FBANDS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fbands")
_TORCH = os.path.dirname(torch.__file__)
_HERE = os.path.abspath(__file__)
_state = threading.local()


@dataclasses.dataclass(frozen=True)
class Finding:
    """One flagged op: what it was, why it waits for the device, and who called it."""

    op: str
    reason: str
    where: str  # "path:line in function" of the innermost frame outside torch
    in_fbands: bool

    def __str__(self) -> str:
        return f"{self.op} ({self.reason}) at {self.where}"


def _caller() -> tuple[str, bool]:
    """The innermost frame outside torch and this file (the code that asked torch for the
    op), and whether it is fbands' own."""
    for frame in reversed(traceback.extract_stack()[:-1]):
        path = os.path.abspath(frame.filename)
        if path != _HERE and not path.startswith(_TORCH + os.sep):
            return f"{frame.filename}:{frame.lineno} in {frame.name}", path.startswith(
                _FBANDS + os.sep)
    return "?", False


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for item in x:
            yield from _tensors(item)


def _is_mask(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)


def sync_reason(func, args, kwargs) -> str | None:
    """Why the aten op ``func`` called with ``args``/``kwargs`` waits for the device (None:
    it does not)."""
    packet = func.overloadpacket
    if packet in _SYNC_PACKETS:
        return _SYNC_PACKETS[packet]
    if packet in _INDEX_PACKETS and len(args) > 1 and any(_is_mask(i) for i in args[1]):
        return "boolean mask indexing: output size depends on the values"
    if packet is aten.repeat_interleave and isinstance(args[0], torch.Tensor):
        repeats_is_tensor = func is aten.repeat_interleave.Tensor or isinstance(
            args[1] if len(args) > 1 else kwargs.get("repeats"), torch.Tensor)
        if repeats_is_tensor and kwargs.get("output_size") is None:
            return "repeat_interleave without output_size: output size depends on the values"
    if packet is aten._to_copy and "device" in kwargs and kwargs["device"] is not None:
        src, dst = args[0].device, torch.device(kwargs["device"])
        if (src.type == "cpu") != (dst.type == "cpu") and "meta" not in (src.type, dst.type):
            return f"copy {src.type} -> {dst.type}"
    if packet is aten.copy_:
        dst, src = args[0].device, args[1].device
        if (src.type == "cpu") != (dst.type == "cpu") and "meta" not in (src.type, dst.type):
            return f"copy {src.type} -> {dst.type}"
    return None


class SyncDetector(TorchDispatchMode):
    """Record every aten op and flag those that synchronise a device with the host.

    Attributes
    ----------
    ops : list of str
        Every aten op that ran, in order (``"aten.mul.Tensor"``).
    syncs : list of Finding
        The ops and method calls that wait for the device.
    uploads : list of Finding
        Tensors built from host data (``torch.tensor([...])``), a blocking copy on a device.
    """

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []
        self.syncs: list[Finding] = []
        self.uploads: list[Finding] = []
        self._patches = contextlib.ExitStack()

    # -- the op counter ---------------------------------------------------------------------
    @property
    def op_count(self) -> int:
        return len(self.ops)

    def counts(self) -> collections.Counter:
        return collections.Counter(self.ops)

    def fbands_syncs(self) -> list[Finding]:
        """The syncs called from the fbands package's own code."""
        return [f for f in self.syncs if f.in_fbands]

    def report(self) -> str:
        lines = [f"{self.op_count} aten ops, {len(self.syncs)} syncs, "
                 f"{len(self.uploads)} uploads"]
        lines += [f"  sync: {f}" for f in self.syncs]
        lines += [f"  upload: {f}" for f in self.uploads]
        return "\n".join(lines)

    def _flag(self, bucket: list, op: str, reason: str) -> None:
        where, in_fbands = _caller()
        bucket.append(Finding(op, reason, where, in_fbands))

    # -- dispatch ---------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops.append(str(func))
        if not getattr(_state, "reading", 0):  # a wrapped method already counted the read
            reason = sync_reason(func, args, kwargs)
            if reason is not None:
                self._flag(self.syncs, str(func), reason)
            elif func.overloadpacket is aten.lift_fresh and args[0].dim() > 0:
                self._flag(self.uploads, str(func), "tensor from host data")
        return func(*args, **kwargs)

    # -- reads that bypass the dispatcher ---------------------------------------------------
    def _wrap(self, name: str):
        original = getattr(torch.Tensor, name)
        detector = self

        def read(t, *args, **kwargs):
            if getattr(_state, "reading", 0):
                return original(t, *args, **kwargs)
            if not (name == "cpu" and t.device.type == "meta"):
                detector._flag(detector.syncs, f"Tensor.{name}", "host read")
            _state.reading = 1
            try:
                return original(t, *args, **kwargs)
            finally:
                _state.reading = 0

        read.__name__ = name
        return original, read

    def __enter__(self):
        for name in _METHODS:
            original, read = self._wrap(name)
            setattr(torch.Tensor, name, read)
            self._patches.callback(setattr, torch.Tensor, name, original)
        try:
            return super().__enter__()
        except BaseException:
            self._patches.close()
            raise

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._patches.close()
