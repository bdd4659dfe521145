"""Adding a backend: the toy "cpu-serial" backend (tests/backends/toy_serial/) lives in its own
folder and is registered by one call, the same fields as a line of kernforge's backend table.
Then kernforge.compile, get_kernel_source, dump, the CLI and the device defaults all reach it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import kernforge
import kernforge.dsl as T
from kernforge import backends, cli
from kernforge.codegen.renderer import Target

pytestmark = pytest.mark.usefixtures("toy")


@pytest.fixture
def toy(monkeypatch):
    from kernforge.backends import registry
    from tests.conftest import host_backend_skip_reason

    reason = host_backend_skip_reason("cpu")
    if reason:
        pytest.skip(reason)

    monkeypatch.setattr(registry, "_ENTRIES", dict(registry._ENTRIES))
    monkeypatch.setattr(registry, "_INSTANCES", dict(registry._INSTANCES))
    backends.register("cpu-serial", "tests.backends.toy_serial.backend:SerialBackend", device="cpu", lang="c++")


def scale_rows():
    M = T.symbolic("M")

    @T.prim_func
    def scale(X: T.Tensor((M, 24), "float32"), w: T.Tensor((24,), "float32"), Y: T.Tensor((M, 24), "float32")):
        with T.Kernel(T.ceildiv(M, 8), threads=32) as bx:
            tile = T.alloc_shared((8, 24), "float32")
            T.copy(X[bx * 8, 0], tile)
            for i, j in T.Parallel(8, 24):
                tile[i, j] = tile[i, j] * w[j] + 1.0
            T.copy(tile, Y[bx * 8, 0])
    return scale


def test_the_toy_backend_compiles_runs_and_matches_float64():
    kernel = kernforge.compile(scale_rows(), backend="cpu-serial", out_idx=[-1])
    x, w = torch.randn(29, 24), torch.randn(24)  # 29 rows: a ragged last block
    y = kernel(x, w)
    expect = x.double() * w.double() + 1.0
    torch.testing.assert_close(y.double(), expect, rtol=1e-6, atol=1e-6)
    src = kernel.get_kernel_source()
    assert "toy cpu-serial backend" in src and "#pragma omp parallel" not in src
    assert kernel.launcher.program.source is src


def test_its_pipeline_is_dumped_with_its_own_pass_and_the_analyses():
    steps = []
    backends.get("cpu-serial").render(scale_rows().ir, Target("cpu-serial"), dump=lambda n, _: steps.append(n))
    # the CPU pipeline puts its GEMM operand layout pass after the first transform
    assert steps == ["simplify", "gemm_layout", "lower_copies", "simplify", "unroll_nothing", "simplify",
                     "names", "nonneg_vars", "memory"]


def test_the_cli_emits_it(capsys, monkeypatch):
    from kernforge.kernels import registry

    spec = registry.get("topk_fp32")
    assert cli.main(["emit", spec.name, "--backend", "cpu-serial", "--problem", "small"]) == 0
    out = capsys.readouterr().out
    assert "toy cpu-serial backend" in out and "extern \"C\" int kf_" in out


def test_the_table_knows_its_device_and_language_and_the_cpu_stays_the_default():
    assert backends.device("cpu-serial") == "cpu" and backends.lang("cpu-serial") == "c++"
    assert backends.for_tensor(torch.empty(1)) == "cpu"
    assert "cpu-serial" in backends.available()


def test_numpy_arguments_reach_it_too():
    kernel = kernforge.compile(scale_rows(), backend="cpu-serial", out_idx=[-1])
    x, w = np.random.default_rng(3).standard_normal((5, 24)).astype(np.float32), np.ones(24, np.float32)
    np.testing.assert_allclose(kernel(x, w), x + 1.0, rtol=1e-6)
