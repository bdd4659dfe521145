"""Shared fixtures: one torch thread while these tests run, and tiny random models.

The reference runs many small ops; on the 2-core test machine, shared with
other jobs, torch's second OpenMP thread mostly spin-waits (measured 30x
slower under load), so the model tests pin torch to one thread and restore
the previous setting afterwards.
"""

import pytest
import torch

from kernforge.model import random_model, tiny


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def tiny_f32(_one_torch_thread):
    return random_model(tiny(), seed=0)


@pytest.fixture(scope="module")
def tiny_f64(_one_torch_thread):
    return random_model(tiny(), seed=0, dtype=torch.float64)
