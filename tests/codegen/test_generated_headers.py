"""Generated files shipped in the tree are exactly what their generators in tools/ produce,
so editing the generator (not the output) is the only way to change them."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import kernforge

REPO = Path(__file__).resolve().parents[2]


def _load_tool(name: str):
    path = REPO / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_kf_tool_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _shipped(relative: str) -> Path:
    """The one file of the installed package whose path ends in ``relative`` (wherever the
    package keeps its templates)."""
    found = sorted(Path(kernforge.__file__).resolve().parent.glob(f"**/{relative}"))
    assert len(found) == 1, f"expected one {relative} under the kernforge package, found {found}"
    return found[0]


def test_wgmma_header_is_the_generators_output(tmp_path):
    shipped = _shipped("kf/wgmma.cuh")
    out = tmp_path / "wgmma.cuh"
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "gen_wgmma.py"), "--output", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == shipped.read_bytes(), \
        f"{shipped} differs from tools/gen_wgmma.py's output: edit the generator, then rerun it"


def test_wgmma_generator_defaults_to_the_shipped_header():
    gen = _load_tool("gen_wgmma")
    assert gen.DEFAULT_OUTPUT.resolve() == _shipped("kf/wgmma.cuh")
    assert gen.main(["--check"]) == 0


def test_wgmma_generator_covers_every_width():
    """One struct per (type, N) with N/2 accumulator registers, for N = 8 .. 256 step 8."""
    text = _load_tool("gen_wgmma").render()
    for ptx, infix, dispatch in (("bf16", "bf16", "WgmmaBf16"), ("f16", "f16", "WgmmaF16")):
        for n in range(8, 257, 8):
            assert f"struct Wgmma_{infix}_{n} {{\n  static KF_DEVICE void run(float (&d)[{n // 2}]," in text
            assert f".m64n{n}k16.f32.{ptx}.{ptx} {{%0, " in text
            assert f'"+f"(d[{n // 2 - 1}])\n' in text and f'"+f"(d[{n // 2}])' not in text.split(
                f"struct Wgmma_{infix}_{n} ")[1].split("};")[0]
            assert f"struct {dispatch}<{n}, TA, TB> : Wgmma_{infix}_{n}<TA, TB> {{}};" in text
