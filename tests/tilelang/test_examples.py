"""The TileLang programs under examples/ run unchanged through ``python -m kernforge.tilelang``
(``kernforge.tilelang.__main__.run``) on interp, cpu and cuda-emu, each checking itself
against its own torch reference (a mismatch raises inside the script)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from kernforge.tilelang.__main__ import run

HERE = Path(__file__).parent / "examples"
ALL = sorted(p.name for p in HERE.glob("*.py"))
# compiled backends build every kernel with a C++ compiler: a representative few
CPU = ["layernorm.py", "splitk_gemm.py", "thread_reduce.py"]
EMU = ["splitk_gemm.py", "thread_reduce.py"]


@pytest.fixture
def backend_env(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNFORGE_TUNE_DB", str(tmp_path / "tune.sqlite"))

    def use(name):
        monkeypatch.setenv("KERNFORGE_TILELANG_BACKEND", name)
    return use


def test_suite_size():
    assert len(ALL) >= 15


def _run(name, capsys):
    before = set(sys.modules)
    g = run(str(HERE / name))
    out = capsys.readouterr().out
    assert "tilelang" not in sys.modules or "tilelang" in before  # the alias is gone again
    return g, out


@pytest.mark.parametrize("name", ALL)
def test_interp(name, backend_env, capsys):
    backend_env("interp")
    _, out = _run(name, capsys)
    assert "ok" in out or "matches" in out


@pytest.mark.parametrize("name", CPU)
def test_cpu(name, backend_env, capsys):
    backend_env("cpu")
    _, out = _run(name, capsys)
    assert "ok" in out


@pytest.mark.parametrize("name", EMU)
def test_cuda_emu(name, backend_env, capsys):
    backend_env("cuda-emu")
    _, out = _run(name, capsys)
    assert "ok" in out


def test_multi_kernel_launches_in_order(backend_env, capsys):
    """splitk's combine kernel reads what the first wrote: run alone, the output would be
    uninitialised; the result matching torch shows both ran, in order, over shared scratch."""
    backend_env("interp")
    g, _ = _run("splitk_gemm.py", capsys)
    f = g["matmul_splitk"]
    assert len(f.get_tir(M=32, N=48, K=64).kernels) == 2
    kernel = f.compile(M=32, N=48, K=64)
    assert [k.ir.name for k in kernel.launch.kernels] == ["matmul_splitk_k0", "matmul_splitk_k1"]
    assert os.environ["KERNFORGE_TILELANG_BACKEND"] == kernel.backend == "interp"
