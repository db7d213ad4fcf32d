"""fbands: probability-aware trust regions for reinforcement learning on language models.

The band of a token with old probability ``p`` is the interval of ratios
``pi_new(a) / pi_old(a)`` that an f-divergence ball of radius ``delta`` allows.
"""

import typing as _typing

from fbands.bands import BACKENDS as BACKENDS
from fbands.bands import bounds as bounds
from fbands.bands import log_bounds as log_bounds
from fbands.bands import precompile as precompile
from fbands.calibrate import calibrate_delta as calibrate_delta
from fbands.divergences import Divergence as Divergence
from fbands.divergences import available as available
from fbands.divergences import get as get
from fbands.divergences import register as register
from fbands.errors import BandError as BandError
from fbands.errors import ConfigError as ConfigError
from fbands.errors import DivergenceError as DivergenceError
from fbands.errors import FBandsError as FBandsError
from fbands.errors import LossError as LossError
from fbands.schedules import AdaptiveDelta as AdaptiveDelta
from fbands.schedules import DeltaSchedule as DeltaSchedule
from fbands.schedules import parse_schedule as parse_schedule

if _typing.TYPE_CHECKING:
    from fbands.backends.cvxpy_backend import reference_band as reference_band

#: The one version string (pyproject.toml reads it: ``[tool.setuptools.dynamic]``).
__version__ = "0.1.0"

# Imported on first use, so that ``import fbands`` loads only numpy, sympy and the registry
# (torch, numba, cvxpy and matplotlib come with the backend or module that needs them).
_LAZY = {"reference_band": "fbands.backends.cvxpy_backend"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fbands' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_LAZY])
