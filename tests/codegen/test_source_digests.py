"""Every library kernel's generated source, on every backend, arch and variant, is byte-identical
to the recorded digests (``tools/source_digests.py`` explains how to regenerate after an intended
change).  A refactoring that changes a single byte of output fails here, naming the sources."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import source_digests  # noqa: E402


@pytest.mark.slow
def test_generated_sources_match_the_recorded_digests():
    want = json.loads(source_digests.DIGESTS.read_text())
    got = {key: source_digests.digest(text) for key, text in source_digests.sources()}
    assert len(got) >= 200, "the registry lost kernels or problems"
    assert sorted(got) == sorted(want), "the set of (kernel, problem, backend, target) changed"
    differ = sorted(k for k in want if want[k] != got[k])
    assert not differ, f"{len(differ)} generated sources changed: {differ[:8]}"


def test_a_changed_byte_is_detected():
    key, text = next(iter(source_digests.sources()))
    assert source_digests.digest(text + " ") != source_digests.digest(text)
    assert json.loads(source_digests.DIGESTS.read_text())[key] == source_digests.digest(text)
