"""The kernel tests compare at float32 tolerances, so their float32 matmuls must be float32: GPUs default to
TF32 (on the H200 the interpret-mode kernel and the reference then differed by up to 7.7e-4). On CPU this
changes nothing."""

import jax
import pytest


@pytest.fixture(autouse=True)
def float32_matmuls():
  with jax.default_matmul_precision("highest"):
    yield
