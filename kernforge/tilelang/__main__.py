"""``python -m kernforge.tilelang script.py [args...]``: run a TileLang script unchanged on
kernforge.

For the script's run only, ``sys.modules`` maps ``tilelang`` (and ``tilelang.language``,
``tilelang.profiler``, ``tilelang.cuda``, ``tilelang.tvm``) and ``tvm`` (``tvm.tir``,
``tvm.tirx``) to ``kernforge.tilelang``; a real ``tilelang`` installed on the machine is
neither imported nor changed, and the aliases are removed again when the script returns.
``$KERNFORGE_TILELANG_BACKEND`` chooses the backend for the whole script.
"""
from __future__ import annotations

import contextlib
import runpy
import sys


def aliases() -> dict:
    """The module names a TileLang script imports -> kernforge's modules."""
    import kernforge.tilelang as tl

    return {
        "tilelang": tl, "tilelang.language": tl.language, "tilelang.profiler": tl.profiler,
        "tilelang.cuda": tl.cuda, "tilelang.tvm": tl.tvm, "tilelang.jit": sys.modules["kernforge.tilelang.jit"],
        "tilelang.autotuner": sys.modules["kernforge.tilelang.autotune"],
        "tvm": tl.tvm, "tvm.tir": tl.tvm.tir, "tvm.tirx": tl.tvm.tirx,
    }


@contextlib.contextmanager
def aliased():
    """``tilelang``/``tvm`` resolve to kernforge inside the block, and to what they were after."""
    table = aliases()
    saved = {k: sys.modules.get(k) for k in table}
    sys.modules.update(table)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def run(path: str, argv=()) -> dict:
    """Run the script at ``path`` as ``__main__`` under the aliases; its globals are returned."""
    import os

    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))  # as `python script.py` does
    try:
        with aliased():
            return runpy.run_path(path, run_name="__main__")
    finally:
        sys.argv, sys.path[:] = old_argv, old_path


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    run(argv[0], argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
