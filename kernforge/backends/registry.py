"""The backend table: every backend is one line here, and nothing else branches on backend names.

A backend is a folder under ``kernforge/backends/`` (renderer, pass list,
templates, compile/load/launch glue); this table says where its class lives,
which torch device its buffers live on, and which language its renderer writes.
Everything that used to branch on ``x.is_cuda`` or ``backend.startswith("cuda")``
asks this table instead:

* :func:`for_device` / :func:`for_tensor`: the backend a tensor gets when an op
  or tool is not told one (the entry marked ``default``);
* :func:`device`: where a backend's buffers must be (``"cpu"``, ``"cuda"``, ...);
* :func:`lang`: what its renderer writes (``"cuda"`` for both ``cuda`` and
  ``cuda-emu``), which is what configuration choosers key tile sizes on.

Adding a backend: create its folder, then add one :class:`Entry` to ``_TABLE``
(or, from outside the package, call :func:`register` with the same fields).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Optional, Union

from kernforge.backends.base import Backend, BackendError


@dataclass(frozen=True)
class Entry:
    """One backend: ``where`` is ``"module:Class"`` (or a factory), ``None`` while it is only planned."""

    name: str
    where: Union[str, Callable[[], Backend], None]
    device: str  # torch device type of the buffers it takes: "cpu", "cuda", "npu"
    lang: str  # what its renderer writes: "ir", "c++", "cuda", "ascend-c"
    default: bool = False  # the backend tensors on `device` get when none is named


_TABLE = [
    Entry("interp", "kernforge.backends.interp.backend:InterpBackend", device="cpu", lang="ir"),
    Entry("cpu", "kernforge.backends.cpu.backend:CpuBackend", device="cpu", lang="c++", default=True),
    Entry("cuda-emu", "kernforge.backends.cuda_emu.backend:CudaEmuBackend", device="cpu", lang="cuda"),
    Entry("cuda", "kernforge.backends.cuda.backend:CudaBackend", device="cuda", lang="cuda", default=True),
    Entry("ascend-emu", "kernforge.backends.ascend_emu.backend:AscendEmuBackend", device="cpu", lang="ascend-c"),
    Entry("ascend", "kernforge.backends.ascend.backend:AscendBackend", device="npu", lang="ascend-c", default=True),
]
_ENTRIES: dict[str, Entry] = {e.name: e for e in _TABLE}
_INSTANCES: dict[str, Backend] = {}


def register(name: str, where: Union[str, Callable[[], Backend]], *, device: str, lang: str,
             default: bool = False) -> None:
    """Add (or replace) a backend from outside this package: the same fields as a table line."""
    _ENTRIES[name] = Entry(name, where, device, lang, default)
    _INSTANCES.pop(name, None)


def entry(name: str) -> Entry:
    """The table line of ``name``; :class:`BackendError` naming the known ones if there is none."""
    found = _ENTRIES.get(name)
    if found is None:
        raise BackendError(f"unknown backend {name!r}; known: {', '.join(names())}")
    return found


def names() -> list[str]:
    return sorted(_ENTRIES)


def get(name: str) -> Backend:
    """The backend called ``name`` (one instance per process); a clear :class:`BackendError`
    if it does not exist or is not built yet."""
    backend = _INSTANCES.get(name)
    if backend is not None:
        return backend
    e = entry(name)
    if e.where is None:
        built = [n for n, x in _ENTRIES.items() if x.where is not None]
        raise BackendError(f"backend {name!r} is not implemented yet in this version of kernforge "
                           f"(available: {', '.join(built)})")
    factory = e.where
    if isinstance(factory, str):
        module, _, attr = factory.partition(":")
        factory = getattr(importlib.import_module(module), attr)
    backend = factory()
    backend.name, backend.device, backend.lang = e.name, e.device, e.lang
    _INSTANCES[name] = backend
    return backend


def available() -> list[str]:
    """The backends this machine can build for (their glue imports); device presence is not checked."""
    out = []
    for name in _ENTRIES:
        try:
            get(name)
        except BackendError:
            continue
        out.append(name)
    return out


def device(name: str) -> str:
    """The torch device type whose tensors backend ``name`` takes."""
    return entry(name).device


def lang(name: str) -> str:
    """The language backend ``name`` generates; configuration choosers key on it."""
    return entry(name).lang


def for_device(device_type: str) -> str:
    """The backend used for tensors on ``device_type`` when none is named."""
    for e in _ENTRIES.values():
        if e.default and e.device == device_type:
            return e.name
    raise BackendError(f"no kernforge backend takes {device_type!r} tensors "
                       f"(backends by device: {', '.join(f'{e.name}={e.device}' for e in _ENTRIES.values())})")


def for_tensor(tensor, backend: Optional[str] = None) -> str:
    """``backend`` if given, else the default backend of ``tensor``'s device."""
    if backend is not None:
        entry(backend)
        return backend
    return for_device(tensor.device.type)
