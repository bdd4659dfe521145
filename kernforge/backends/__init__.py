"""Backends: one folder each (renderer, pass list, templates, compile/load/launch glue), one line each
in :mod:`kernforge.backends.registry`.  ``from kernforge import backends; backends.get("cpu")``."""
from kernforge.backends.base import Backend, BackendError, Launcher
from kernforge.backends.registry import (Entry, available, device, entry, for_device, for_tensor, get, lang, names,
                                         register)

__all__ = ["Backend", "BackendError", "Entry", "Launcher", "available", "device", "entry", "for_device",
           "for_tensor", "get", "lang", "names", "register"]
