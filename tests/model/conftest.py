"""Shared fixtures: tiny random models, built once per module."""

import pytest
import torch

from kernforge.model import random_model, tiny


@pytest.fixture(scope="module")
def tiny_f32():
    return random_model(tiny(), seed=0)


@pytest.fixture(scope="module")
def tiny_f64():
    return random_model(tiny(), seed=0, dtype=torch.float64)
