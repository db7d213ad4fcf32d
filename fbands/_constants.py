"""Small constant tensors, made once per (values, dtype, device) and then reused.

``torch.tensor([...], device="cuda")`` copies host memory to the device, and a copy from
pageable memory makes the host wait for the device's stream: a synchronisation on every
call of a function that builds its constants that way.  :func:`device_constant` builds
each constant once per process and device.  The tensors it returns are shared: read them,
never write to them.
"""

from __future__ import annotations

import torch

from fbands._state import STATE

_CONSTANTS = STATE.memo("device constants", "small constant tensors, by (values, dtype, "
                       "device)")


def device_constant(values: tuple[float, ...], dtype: torch.dtype,
                    device: torch.device) -> torch.Tensor:
    """The 1-d tensor of ``values`` in ``dtype`` on ``device``, built on the first call only.

    Examples
    --------
    >>> a = device_constant((0.1, 0.5), torch.float64, torch.device("cpu"))
    >>> a is device_constant((0.1, 0.5), torch.float64, torch.device("cpu"))
    True
    """
    key = (tuple(values), dtype, torch.device(device))
    return _CONSTANTS.get_or_make(key, lambda: torch.tensor(values, dtype=dtype, device=device))
