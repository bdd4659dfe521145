"""Shared helpers of the Ascend tests: the C++ compiler the ascend-emu shim needs."""
from __future__ import annotations

import pytest


def cxx() -> str:
    """The C++ compiler kernforge's runtime would use (the shim is plain C++17), or skip."""
    from kernforge.runtime.compilers import make_compiler
    from kernforge.runtime.config import Config
    from kernforge.runtime.errors import ConfigError, ToolchainNotFoundError

    try:
        return make_compiler("cpu", Config.from_env()).binary
    except (ToolchainNotFoundError, ConfigError) as e:
        pytest.skip(f"ascend-emu needs a C++ compiler: {e}")


@pytest.fixture(scope="session")
def shim_cxx() -> str:
    return cxx()
