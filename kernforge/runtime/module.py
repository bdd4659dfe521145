"""Loaded modules and the functions in them (CPU: a ``.so`` through ctypes).

``module.get_function(name)`` returns a :class:`Function` whose ``cfunc`` is
the raw ctypes function pointer (for code that marshals its own arguments).
Given a signature, ``module.get_function(name, argtypes=("ptr", "ptr"),
restype="i32")`` also makes the function callable with checked arguments::

    fn = module.get_function("kf_add", argtypes=("ptr", "ptr"), restype="i32")
    status = fn(pack_pointers([x, y, out]), pack_dims([n]))

The CUDA module lives in :mod:`kernforge.runtime.cuda_module`.
"""

from __future__ import annotations

import ctypes
import os
import threading

from .args import CTYPES, check_signature, convert
from .errors import LoadError


class CompileResult:
    """A published cache entry: what ``compile_without_load`` returns."""

    def __init__(self, entry_dir: str, manifest: dict, miss_reason: str | None):
        self.path = entry_dir
        self.manifest = manifest
        self.miss_reason = miss_reason  # None when the entry came from the cache

    @property
    def key(self) -> str:
        return self.manifest["key"]

    @property
    def backend(self) -> str:
        return self.manifest["backend"]

    @property
    def binary_path(self) -> str:
        return os.path.join(self.path, self.manifest["binary"])

    @property
    def resource_usage(self) -> dict:
        """Per-kernel registers, shared memory and spills (CUDA); {} elsewhere."""
        return self.manifest.get("extra", {}).get("resource_usage", {})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(key={self.key!r}, path={self.path!r})"


class Module(CompileResult):
    """A loaded binary. Subclasses implement ``_load`` and ``_function``."""

    device = "cpu"

    def __init__(self, entry_dir, manifest, miss_reason):
        super().__init__(entry_dir, manifest, miss_reason)
        self._functions: dict[tuple, "Function"] = {}
        self._lock = threading.Lock()

    def get_function(self, name: str, argtypes=None, restype: str = "i32") -> "Function":
        signature = None if argtypes is None else check_signature(argtypes, restype)
        cache_key = (name, signature)
        found = self._functions.get(cache_key)
        if found is None:
            with self._lock:
                found = self._functions.get(cache_key) or self._function(name, signature)
                self._functions[cache_key] = found
        return found

    def _function(self, name, signature):
        raise NotImplementedError


class CpuModule(Module):
    def __init__(self, entry_dir, manifest, miss_reason):
        super().__init__(entry_dir, manifest, miss_reason)
        try:
            self._library = ctypes.CDLL(self.binary_path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError as exc:
            raise LoadError(f"cannot load {self.binary_path}: {exc}") from exc

    def _function(self, name, signature):
        try:
            address = ctypes.cast(getattr(self._library, name), ctypes.c_void_p).value
        except AttributeError:
            raise LoadError(f"symbol {name!r} not found in {self.binary_path} (is it extern \"C\"?)") from None
        return Function(self, name, address, signature)


class Function:
    """One exported symbol. ``cfunc`` is the ctypes function pointer."""

    def __init__(self, module: Module, name: str, address: int, signature):
        self.module = module
        self.name = name
        self.address = address
        self.signature = signature
        if signature is None:
            self.cfunc = ctypes.CFUNCTYPE(ctypes.c_int)(address)
        else:
            argtypes, restype = signature
            prototype = ctypes.CFUNCTYPE(None if restype == "void" else CTYPES[restype], *[CTYPES[k] for k in argtypes])
            self.cfunc = prototype(address)

    @property
    def argtypes(self):
        return None if self.signature is None else self.signature[0]

    def __call__(self, *args):
        if self.signature is None:
            raise LoadError(
                f"{self.name} has no declared signature: use get_function({self.name!r}, argtypes=...) "
                "or call .cfunc directly"
            )
        values = convert(self.signature[0], args, self.module.device, self.name)
        return self.cfunc(*values)

    def __repr__(self) -> str:
        return f"Function({self.name!r}, argtypes={self.argtypes})"
