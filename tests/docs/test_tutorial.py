"""docs/tutorial.md runs: every ```python block, in order, in one namespace.

The blocks check their own results against torch (asserts in the doc), so a tutorial
step that stops working, or stops matching torch, fails here.  Each block is compiled
with the tutorial's own file name and line numbers: the DSL's source rewrite (runtime
``if``, ``T.alloc_var`` stores) reads the kernel's source through them, exactly as it
reads an author's .py file, and errors point at ``docs/tutorial.md:LINE``.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import host_backend_skip_reason

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(first code line, code) of every ```python block."""
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in _BLOCK.finditer(text)]


def test_blocks_are_found():
    blocks = python_blocks(TUTORIAL.read_text())
    assert len(blocks) >= 12
    assert all(code.strip() for _, code in blocks)


def test_tutorial_runs_in_order():
    """The whole tutorial, on interp, cpu and cuda-emu (about 25 s, mostly g++)."""
    for backend in ("cpu", "cuda-emu"):
        reason = host_backend_skip_reason(backend)
        if reason:
            pytest.skip(reason)
    namespace: dict = {"__name__": "tutorial"}
    for line, code in python_blocks(TUTORIAL.read_text()):
        padded = "\n" * (line - 1) + code  # keep the tutorial's line numbers
        try:
            exec(compile(padded, str(TUTORIAL), "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"the tutorial block at docs/tutorial.md:{line} failed: "
                                 f"{type(e).__name__}: {e}") from e
