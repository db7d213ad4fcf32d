"""fbands: probability-aware trust regions for reinforcement learning on language models.

The band of a token with old probability ``p`` is the interval of ratios
``pi_new(a) / pi_old(a)`` that an f-divergence ball of radius ``delta`` allows.
"""

from fbands.backends.cvxpy_backend import reference_band as reference_band
from fbands.bands import BACKENDS as BACKENDS
from fbands.bands import bounds as bounds
from fbands.bands import log_bounds as log_bounds
from fbands.divergences import Divergence as Divergence
from fbands.divergences import available as available
from fbands.divergences import get as get
from fbands.divergences import register as register
from fbands.errors import BandError as BandError
from fbands.errors import ConfigError as ConfigError
from fbands.errors import DivergenceError as DivergenceError
from fbands.errors import LossError as LossError

__version__ = "0.1.0"
