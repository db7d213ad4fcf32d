"""The trainer's checkpoint: write it atomically, read it safely, check every entry.

:func:`save_atomic` writes a :func:`sealed` checkpoint: its entries with the SHA-256 of their
content (every tensor's bytes, dtype and shape, and every plain value) under
:data:`DIGEST`.  :func:`load_checkpoint` reads ``checkpoint.pt`` with
``torch.load(weights_only=True)`` (only tensors and plain data: a file that asks to run code
is refused, never executed), recomputes the digest (one flipped bit in a weight is found),
and checks each entry's type and range and that the weights are finite, so that a damaged
or edited file is refused with one :class:`~fbands.errors.ConfigError` before a resumed run
touches any file of its folder.  :func:`rng_state_problem` checks the saved random states
the same way (the model and the optimizer are checked by loading them).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import random
import tempfile
from pathlib import Path

import numpy as np
import torch

from fbands import _checks
from fbands.errors import ConfigError

#: what a checkpoint holds, and the type of each entry
_CHECKPOINT_ENTRIES = {"model": dict, "optimizer": dict, "rng": dict, "step": int,
                       "config": dict}
#: the states of Python's and numpy's Mersenne Twister: 624 32-bit words and a position
_MT_WORDS = 624


#: the entry of a checkpoint that holds the SHA-256 of the others (:func:`content_digest`)
DIGEST = "sha256"


def _feed(h, value) -> None:
    """Add ``value`` (tensors, and plain data holding them) to the hash ``h``: a tag of its
    kind and size before its content, so that no two values feed the same bytes."""
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(value, dict):
        h.update(f"D{len(value)}|".encode())
        for key, item in value.items():
            _feed(h, key)
            _feed(h, item)
    elif isinstance(value, list | tuple):
        h.update(f"{type(value).__name__[0]}{len(value)}|".encode())
        for item in value:
            _feed(h, item)
    else:  # None, bool, int, float (repr is exact), str, bytes, a dtype
        text = repr(value).encode()
        h.update(f"{type(value).__name__}{len(text)}|".encode() + text)


def content_digest(saved: dict) -> str:
    """The SHA-256 of a checkpoint's entries (all but :data:`DIGEST`), in their order."""
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in saved.items() if k != DIGEST})
    return h.hexdigest()


def sealed(saved: dict) -> dict:
    """``saved`` with its :func:`content_digest` under :data:`DIGEST`: what
    :func:`load_checkpoint` accepts as undamaged."""
    return {**{k: v for k, v in saved.items() if k != DIGEST}, DIGEST: content_digest(saved)}


def save_atomic(obj: dict, path: Path) -> None:
    """``torch.save`` the :func:`sealed` ``obj`` to a temporary file in the same folder, then
    rename it over ``path``: a reader sees the old checkpoint or the whole new one.

    Raises :class:`OSError` (naming ``path``, and with no temporary file left behind) when
    the file cannot be written, a full disk say; the previous checkpoint is then intact."""
    tmp = None
    try:
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, prefix=".",
                                         suffix=".tmp") as f:
            tmp = f.name
            torch.save(sealed(obj), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as err:  # torch reports a failed write as RuntimeError
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        reason = _checks.reason(err)
        raise OSError(f"checkpoint {str(path)!r} could not be written ({reason}); the previous "
                      "checkpoint is kept: make room (or fix the folder) and resume with "
                      "--resume") from err


def rng_state(device: torch.device) -> dict:
    """Global RNG states.  The loop draws from per-step generators; these cover user code.

    Only tensors and plain Python data, so that the checkpoint loads with
    ``torch.load(weights_only=True)``: numpy's key becomes an int64 tensor.
    """
    np_state = np.random.get_state(legacy=False)  # noqa: NPY002
    state = {"python": random.getstate(),  # (version, tuple of ints, gauss or None)
             "numpy": {"bit_generator": np_state["bit_generator"],
                       "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                       "pos": int(np_state["state"]["pos"]),
                       "has_gauss": int(np_state["has_gauss"]),
                       "gauss": float(np_state["gauss"])},
             "torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    """Restore :func:`rng_state` (check it first with :func:`rng_state_problem`)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state({"bit_generator": np_state["bit_generator"],  # noqa: NPY002
                         "state": {"key": np_state["key"].numpy().astype(np.uint32),
                                   "pos": np_state["pos"]},
                         "has_gauss": np_state["has_gauss"], "gauss": np_state["gauss"]})
    torch.set_rng_state(state["torch"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def _is_int(value, low: int, high: float = math.inf) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _is_words(values, n: int) -> bool:
    """``n`` integers in [0, 2**32): a Mersenne Twister's key."""
    return len(values) == n and all(_is_int(v, 0, 2**32 - 1) for v in values)


def rng_state_problem(state) -> str | None:
    """What is wrong with a saved :func:`rng_state` (None: it restores as saved)."""
    if not isinstance(state, dict) or not {"python", "numpy", "torch"} <= set(state):
        return "needs the entries 'python', 'numpy' and 'torch'"
    py = state["python"]
    if not (isinstance(py, (tuple, list)) and len(py) == 3 and _is_int(py[0], 0)
            and isinstance(py[1], (tuple, list)) and _is_words(py[1][:-1], _MT_WORDS)
            and len(py[1]) == _MT_WORDS + 1 and _is_int(py[1][-1], 0, _MT_WORDS)
            and (py[2] is None or isinstance(py[2], float))):
        return "'python' is not (version, 625 integers, gauss or None)"
    npy = state["numpy"]
    if not isinstance(npy, dict) or npy.get("bit_generator") != "MT19937":
        return "'numpy' is not the state of an MT19937 generator"
    key = npy.get("key")
    if not (isinstance(key, torch.Tensor) and key.dtype == torch.int64
            and tuple(key.shape) == (_MT_WORDS,) and bool(((key >= 0) & (key < 2**32)).all())):
        return f"'numpy.key' is not {_MT_WORDS} 32-bit words (an int64 tensor)"
    if not (_is_int(npy.get("pos"), 0, _MT_WORDS) and npy.get("has_gauss") in (0, 1)
            and isinstance(npy.get("has_gauss"), int) and isinstance(npy.get("gauss"), float)):
        return "'numpy' has no valid pos (0 to 624), has_gauss (0 or 1) or gauss (a float)"
    for name in ("torch", "cuda"):
        value = state.get(name)
        if (name in state or name == "torch") and not (
                isinstance(value, torch.Tensor) and value.dtype == torch.uint8
                and value.dim() == 1):
            return f"{name!r} is not a generator state (a 1-d uint8 tensor)"
    if state["torch"].numel() != torch.get_rng_state().numel():
        return f"'torch' holds {state['torch'].numel()} bytes, not {torch.get_rng_state().numel()}"
    return None


def _not_plain(value, where: str = "") -> str | None:
    """Where ``value`` holds something that a JSON configuration cannot (None: nowhere)."""
    if value is None or isinstance(value, str | int | float | bool):
        return None
    if isinstance(value, list | tuple):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return f"a key that is not text{' in ' + where if where else ''}"
        items = ((f"{where}.{k}" if where else k, v) for k, v in value.items())
    else:
        return f"a {type(value).__name__} at {where or 'the top'}"
    for at, v in items:
        odd = _not_plain(v, at)
        if odd is not None:
            return odd
    return None


def _entry_problem(saved: dict) -> str | None:
    """What is wrong with the plain entries of a checkpoint (None: nothing)."""
    for key, kind in _CHECKPOINT_ENTRIES.items():
        if not isinstance(saved.get(key), kind) or isinstance(saved.get(key), bool):
            return (f"has no valid {key!r} entry (got {type(saved.get(key)).__name__}); it is "
                    "not a complete fbands checkpoint")
    odd = _not_plain(saved["config"])
    if odd is not None:
        return (f"has a 'config' entry that is not plain data ({odd}); it is not an fbands "
                "checkpoint's configuration")
    steps = saved["config"].get("steps")
    last = steps if _is_int(steps, 1) else math.inf
    if not _is_int(saved["step"], 0, last):
        return (f"has step={_checks.shown(saved['step'])}, not a step of its run (0 to "
                f"{steps if last < math.inf else 'its steps'})")
    kl = saved.get("kl_cumulative", 0.0)
    if _checks.violation(kl, low=0.0) is not None:
        return (f"has kl_cumulative={_checks.shown(kl)}; a sum of KL estimates is a finite "
                "number >= 0")
    position = saved.get("data_position", 0)
    if not _is_int(position, 0):
        return f"has data_position={_checks.shown(position)}; it must be an integer >= 0"
    if "delta_schedule" in saved and not isinstance(saved["delta_schedule"], dict):
        return "has a 'delta_schedule' entry that is not a table"
    broken = rng_state_problem(saved["rng"]) if saved["rng"] else None
    return None if broken is None else f"has a damaged 'rng' entry: {broken}"


def _digest_problem(saved: dict) -> str | None:
    """Whether the content of ``saved`` is what was written (None) or was changed since."""
    recorded = saved.get(DIGEST)
    if not isinstance(recorded, str):
        return (f"has no {DIGEST!r} entry, so its content cannot be checked (it was not "
                "written by fbands train, or by a version before checkpoints carried one)")
    try:
        same = content_digest(saved) == recorded
    except (RuntimeError, TypeError, ValueError):  # a tensor that has no bytes to read
        same = False
    if not same:
        return (f"does not match the {DIGEST} recorded in it: the file was damaged after it "
                "was written (a bad disk or copy, a flipped bit) or edited")
    return None


def _weights_problem(saved: dict) -> str | None:
    """Which weight of ``saved['model']`` is NaN or infinite (None: all are finite)."""
    for name, value in saved["model"].items():
        if (isinstance(value, torch.Tensor) and value.is_floating_point()
                and not bool(torch.isfinite(value).all())):
            return (f"holds non-finite weights ({name!r} has NaN or infinite entries): the "
                    "run had diverged when it was written")
    return None


def load_checkpoint(path: str | os.PathLike) -> dict:
    """Read a checkpoint written by :func:`fbands.rl.train.train`, safely.

    ``torch.load(weights_only=True)`` rebuilds only tensors and plain data: a file that
    asks to run code is refused, never executed.  A file that cannot be read (empty,
    truncated, corrupt, not a checkpoint), whose content differs from its recorded digest,
    that lacks an entry or holds one of the wrong type or out of range (a negative step, a
    damaged random state, non-finite weights) raises :class:`ConfigError`.
    (An empty ``rng`` entry passes here: whether the weights fit is found by loading them.)
    """
    path = Path(path)
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # whatever the reason, the file is not a usable checkpoint
        reason = _checks.reason(err)
        raise ConfigError(f"checkpoint {str(path)!r} cannot be read ({reason}); it is empty, "
                          "truncated, corrupt or not an fbands checkpoint: restore a good "
                          "copy, or start a new run in another run_dir") from err
    if not isinstance(saved, dict):
        raise ConfigError(f"checkpoint {str(path)!r} holds a {type(saved).__name__}, not an "
                          "fbands checkpoint")
    broken = _digest_problem(saved) or _entry_problem(saved) or _weights_problem(saved)
    if broken is not None:
        raise ConfigError(f"checkpoint {str(path)!r} {broken}; restore a good copy, or start "
                          "a new run in another run_dir")
    return saved


def saved_step(path: Path) -> int | None:
    """The step of the checkpoint at ``path``; None when there is none or it is unreadable."""
    try:
        return load_checkpoint(path)["step"] if path.exists() else None
    except ConfigError:
        return None
