"""Digests of every library kernel's generated source, for every backend, arch and variant.

``tests/codegen/test_source_digests.py`` compares the library's output against
``tests/codegen/data/source_digests.json``: a refactoring of the DSL, the
passes or a renderer must leave every generated source byte-identical, and a
deliberate change of output regenerates the file (and says why in its commit):

    python tools/source_digests.py --write      # regenerate after an intended change
    python tools/source_digests.py --dump DIR   # the sources themselves, to diff
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

DIGESTS = Path(__file__).resolve().parents[1] / "tests" / "codegen" / "data" / "source_digests.json"
CPU_PATHS = ("avx2", "avx512bf16")  # float-widening and native-bf16 operand layouts
CUDA_TARGETS = (("sm_80", ""), ("sm_90a", ""), ("sm_90a", "cp.async"), ("sm_100a", ""), ("sm_100a", "cp.async"))


def sources():
    """(key, source) for every registry kernel x problem x backend x CUDA arch/variant."""
    from kernforge import backends
    from kernforge.codegen.renderer import Target
    from kernforge.kernels import registry

    for name, spec in sorted(registry.all_specs().items()):
        for label, problem in sorted(spec.problems.items()):
            kernel = spec.factory(**problem.params).ir
            base = f"{name}/{label}"
            yield f"{base}/interp", backends.get("interp").render(kernel, Target("interp")).source
            # the CPU's instruction-set path is explicit: the default follows the machine's compiler
            for arch in CPU_PATHS:
                yield f"{base}/cpu/{arch}", backends.get("cpu").render(kernel, Target("cpu", arch)).source
            for b in ("cuda", "cuda-emu"):
                for arch, variant in CUDA_TARGETS:
                    if problem.for_cuda_arch(arch):  # (MLA's bench is configured for sm_90a / sm_100a)
                        suffix = "-cpasync" if variant else ""
                        yield f"{base}/{b}/{arch}{suffix}", backends.get(b).render(kernel, Target(b, arch, variant)).source


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help=f"rewrite {DIGESTS.relative_to(DIGESTS.parents[2])}")
    p.add_argument("--dump", metavar="DIR", help="also write every source into DIR")
    args = p.parse_args(argv)
    got = {}
    for key, text in sources():
        got[key] = digest(text)
        if args.dump:
            os.makedirs(args.dump, exist_ok=True)
            Path(args.dump, key.replace("/", "__")).write_text(text)
    if args.write:
        DIGESTS.parent.mkdir(parents=True, exist_ok=True)
        DIGESTS.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(got)} digests to {DIGESTS}")
        return 0
    want = json.loads(DIGESTS.read_text())
    differ = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
    print(f"{len(got)} sources, {len(differ)} differ from {DIGESTS.name}" + "".join(f"\n  {k}" for k in differ))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
