"""Run a TileLang script's ``device="cuda"`` tensors on the host, for host backends.

TileLang's examples allocate their inputs with ``device="cuda"`` (or ``.cuda()``,
``.to("cuda")``) and time with ``torch.cuda.synchronize``/``torch.cuda.Event``.  When the
chosen kernforge backend runs on the host (interp, cpu, cuda-emu, ascend-emu), those
tensors must live in host memory instead, and the script must not be edited.

:func:`host_cuda` is a context manager that does this for the duration of one run:

* a :class:`torch.overrides.TorchFunctionMode` rewrites every CUDA device argument of a
  torch call (the ``device=`` of factories such as ``torch.randn``/``torch.empty``, the
  target of ``Tensor.to``) to ``"cpu"``, and makes ``Tensor.cuda()`` return the tensor
  itself.  A mode is scoped: it is popped when the block exits, so nothing outside the run
  sees it, and it changes no torch attribute;
* the few ``torch.cuda`` functions a script calls for synchronisation, timing and streams
  (``synchronize``, ``Event``, ``current_device``, ``set_device``, ``empty_cache``,
  ``Stream``, ``stream``, ``default_stream``, ``current_stream``) are replaced by host
  versions for the block and restored after it.  Streams run in program order on the host,
  one valid order of any multi-stream program;
* ``torch.Generator(device="cuda")`` makes a host generator.

Nothing else of torch changes: a script that really needs a GPU (CUDA graphs,
``torch.cuda.get_device_properties``/``get_device_capability``) still fails as it would on a
machine without one.
"""
from __future__ import annotations

import contextlib
import time


def _is_cuda(dev) -> bool:
    import torch

    if isinstance(dev, torch.device):
        return dev.type == "cuda"
    if isinstance(dev, str):
        return dev.split(":")[0] == "cuda"
    # a bare int device is CUDA ordinal `dev` (torch's convention); bool is not a device
    return isinstance(dev, int) and not isinstance(dev, bool)


def _host(dev):
    return "cpu" if _is_cuda(dev) else dev


class _Event:
    """``torch.cuda.Event(enable_timing=True)`` on the host: ``record`` takes the time,
    ``elapsed_time`` is milliseconds between two records."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self._t = None

    def record(self, stream=None) -> None:
        self._t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: "_Event") -> float:
        if self._t is None or end._t is None:
            raise RuntimeError("Event.elapsed_time: both events must be recorded first")
        return (end._t - self._t) * 1e3


class _Stream:
    """``torch.cuda.Stream()`` on the host.  A host backend runs every launch to completion
    in program order, which is one valid order of any multi-stream program (streams only
    relax ordering), so waits and records have nothing to do."""

    def __init__(self, device=None, priority: int = 0, **_):
        self.device = device

    def synchronize(self) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        event = event or _Event()
        event.record()
        return event

    def query(self) -> bool:
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


_DEFAULT_STREAM = _Stream()


def _generator_class():
    import torch

    base = torch.Generator

    class HostGenerator(base):
        """``torch.Generator(device="cuda")`` makes a host generator (an ordinary
        ``torch.Generator``, so ``isinstance`` and ``generator=`` arguments work).  Its numbers
        are the CPU generator's: a seeded script is reproducible, but not bit-equal to a GPU
        run, which no host run is."""

        def __new__(cls, device="cpu"):
            return base(device=_host(device))

    return HostGenerator


def _mode_class():
    import torch
    from torch.overrides import TorchFunctionMode

    class HostCudaMode(TorchFunctionMode):
        """Rewrites CUDA device arguments of torch calls to the host (module doc)."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func is torch.Tensor.cuda:
                return args[0]
            if "device" in kwargs:
                kwargs["device"] = _host(kwargs["device"])
            if func is torch.Tensor.to:
                # to(device), to(device, dtype), to(dtype), to(tensor): only a device moves
                args = (args[0], *(_host(a) if isinstance(a, (str, torch.device)) else a for a in args[1:]))
            return func(*args, **kwargs)

    return HostCudaMode


_PATCHES = {
    "synchronize": lambda device=None: None,
    "Event": _Event,
    "current_device": lambda: 0,
    "set_device": lambda device: None,
    "empty_cache": lambda: None,
    "Stream": _Stream,
    "stream": lambda stream=None: stream if stream is not None else _DEFAULT_STREAM,
    "default_stream": lambda device=None: _DEFAULT_STREAM,
    "current_stream": lambda device=None: _DEFAULT_STREAM,
}


@contextlib.contextmanager
def host_cuda():
    """Inside the block, torch's CUDA tensors are made in host memory (module doc)."""
    import torch

    saved = {k: getattr(torch.cuda, k) for k in _PATCHES}
    saved_generator = torch.Generator
    for k, v in _PATCHES.items():
        setattr(torch.cuda, k, v)
    torch.Generator = _generator_class()
    try:
        with _mode_class()():
            yield
    finally:
        for k, v in saved.items():
            setattr(torch.cuda, k, v)
        torch.Generator = saved_generator
