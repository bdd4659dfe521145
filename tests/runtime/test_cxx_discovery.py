"""Which C++ compiler the CPU toolchain runs, and how the test suite reports a missing one:
g++ or clang++ from PATH (in that order), or KERNFORGE_JIT_CXX; with none, the host
backends that need it are skipped with the runtime's own reason, not dropped."""
import pytest

from kernforge.runtime.compilers.cpu import CpuCompiler
from kernforge.runtime.errors import ToolchainNotFoundError
from tests.conftest import host_backend_skip_reason, host_backends


def _fake(directory, name):
    path = directory / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return str(path)


def test_clang_is_found_when_g_plus_plus_is_absent(tmp_path, monkeypatch):
    clang = _fake(tmp_path, "clang++")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert CpuCompiler(None).binary == clang
    assert host_backend_skip_reason("cpu") is None


def test_g_plus_plus_comes_first(tmp_path, monkeypatch):
    gxx = _fake(tmp_path, "g++")
    _fake(tmp_path, "clang++")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert CpuCompiler(None).binary == gxx


def test_configured_compiler_wins(tmp_path, monkeypatch):
    _fake(tmp_path, "g++")
    other = tmp_path / "bin"
    other.mkdir()
    mine = _fake(other, "my-c++")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("KERNFORGE_JIT_CXX", mine)
    assert host_backend_skip_reason("cpu") is None
    from kernforge.runtime.compilers import make_compiler
    from kernforge.runtime.config import Config

    assert make_compiler("cpu", Config.from_env()).binary == mine


def test_no_compiler_skips_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory
    with pytest.raises(ToolchainNotFoundError, match=r"g\+\+ or clang\+\+"):
        CpuCompiler(None)
    reason = host_backend_skip_reason("cpu")
    assert reason.startswith("backend 'cpu' needs a C++ compiler: ") and "g++ or clang++" in reason
    emu = host_backend_skip_reason("cuda-emu")
    assert "needs a C++ compiler" in emu or "is not available" in emu  # (absent from some builds)
    assert host_backend_skip_reason("interp") is None


def test_host_backends_lists_every_backend_and_marks_the_unavailable(monkeypatch):
    reasons = {"interp": None, "cpu": "backend 'cpu' needs a C++ compiler: none here", "cuda-emu": None}
    import tests.conftest as conftest

    monkeypatch.setattr(conftest, "_SKIP_REASONS", dict(reasons))
    params = host_backends()
    assert [p.values for p in params] == [("interp",), ("cpu",), ("cuda-emu",)]
    assert [p.id for p in params] == ["interp", "cpu", "cuda-emu"]
    (cpu_mark,) = params[1].marks
    assert cpu_mark.name == "skip" and cpu_mark.kwargs["reason"] == reasons["cpu"]
    assert not params[0].marks and not params[2].marks
    assert "interp" in params and "cpu" not in params
    assert [p.values for p in host_backends("interp", "cpu")] == [("interp",), ("cpu",)]
    with pytest.raises(ValueError, match="host backend"):
        host_backends("cuda")
