import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


import pytest  # noqa: E402

from fbands import divergences  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_registry():
    """Divergences a test registers are gone after it, so tests see the same registry."""
    saved = divergences.registry_snapshot()
    yield
    divergences.restore_registry(saved)


@pytest.fixture
def user_divergence(_restore_registry):
    """The user-registered divergence of tests/_user.py, in the registry for this test."""
    from ._user import TRIANGULAR

    divergences._REGISTRY["triangular"] = TRIANGULAR
    return TRIANGULAR
