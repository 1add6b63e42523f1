"""Settings for every collected test, the docstring examples under ``pyro_flat/`` included."""

import pyro
import pytest


@pytest.fixture(autouse=True)
def _clear_param_store():
    """Each test and docstring example starts with an empty Pyro parameter store (an example
    that fits a guide must not leave its parameters to the next one)."""
    pyro.clear_param_store()
    yield
