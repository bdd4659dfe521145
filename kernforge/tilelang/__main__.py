"""``python -m kernforge.tilelang script.py [args...]``: run a TileLang script unchanged on
kernforge.

For the script's run only, ``sys.modules`` maps ``tilelang`` (and ``tilelang.language``,
``tilelang.profiler``, ``tilelang.cuda``, ``tilelang.tvm``) and ``tvm`` (``tvm.tir``,
``tvm.tirx``) to ``kernforge.tilelang``; a real ``tilelang`` installed on the machine is
neither imported nor changed, and the aliases are removed again when the script returns.
``$KERNFORGE_TILELANG_BACKEND`` chooses the backend for the whole script; when it runs on the
host, the script's ``device="cuda"`` tensors are made in host memory for the run
(:mod:`kernforge.tilelang.host_cuda`).
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
        "tilelang.cuda.intrinsics": tl.cuda, "tilelang.math": tl.math, "tilelang.layout": tl.layout,
        "tilelang.utils": tl.utils, "tilelang.utils.tensor": tl.utils,
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


def script_backend() -> str:
    """The backend a script runs on when its tensors cannot say: ``$KERNFORGE_TILELANG_BACKEND``,
    else ``cuda`` where torch sees a GPU, else ``cpu``."""
    from kernforge.tilelang.jit import select_backend

    return select_backend()


@contextlib.contextmanager
def script_scope(path: str, argv=()):
    """What running the script at ``path`` needs, undone on exit: ``sys.argv``, the script's
    folder first on ``sys.path`` (as ``python script.py`` does; sibling modules it imports are
    dropped from ``sys.modules`` again), the ``tilelang``/``tvm`` aliases and, when the
    backend runs on the host, its ``device="cuda"`` tensors in host memory
    (:mod:`kernforge.tilelang.host_cuda`)."""
    import os

    from kernforge import backends
    from kernforge.tilelang.host_cuda import host_cuda

    folder = os.path.dirname(os.path.abspath(path))
    old_argv, old_path, before = sys.argv, list(sys.path), set(sys.modules)
    sys.argv = [path, *argv]
    sys.path.insert(0, folder)
    on_host = backends.device(script_backend()) == "cpu"
    try:
        with aliased(), (host_cuda() if on_host else contextlib.nullcontext()):
            yield
    finally:
        sys.argv, sys.path[:] = old_argv, old_path
        for name in set(sys.modules) - before:
            f = getattr(sys.modules[name], "__file__", None) or ""
            if os.path.dirname(os.path.abspath(f)) == folder:
                del sys.modules[name]


def run(path: str, argv=()) -> dict:
    """Run the script at ``path`` as ``__main__`` in :func:`script_scope`; its globals are returned."""
    with script_scope(path, argv):
        return runpy.run_path(path, run_name="__main__")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    run(argv[0], argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
