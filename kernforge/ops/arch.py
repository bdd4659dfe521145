"""The CUDA arch an op's kernel is built for: the FP8 GEMM choosers key on it (only sm_100a folds
UE8M0 scales into tensor-core MMAs) and so does MLA decode's (sm_90a takes the seesaw's
64-token tiles).  One module the ops share, so that a new arch-keyed op imports no other op."""
from __future__ import annotations

from typing import Optional

from kernforge import backends


def target_arch(backend: str, arch, resolve: bool = True) -> Optional[str]:
    """The CUDA arch an op's kernel is built for on ``backend``, which the FP8 choosers key on
    (``kernels.gemm.config.block_scaled``: only sm_100a folds UE8M0 scales into tensor-core
    MMAs, and those need 128-row tiles).  ``arch`` if given -- checked here, before anything runs: a
    known CUDA arch, on a backend that generates CUDA -- else the launch target's (the GPU's on
    ``cuda``, the emulator's default sm_90a on ``cuda-emu``); None on other backends, or when not
    ``resolve`` (the caller's configuration does not depend on it: the GPU is not asked)."""
    if arch is None and not resolve:
        return None
    if arch is not None and not isinstance(arch, str):
        raise TypeError(f"arch must be a CUDA arch name such as 'sm_100a', got {type(arch).__name__}")
    if backends.lang(backend) != "cuda":
        if arch is not None:
            raise ValueError(f"arch={arch!r}: backend {backend!r} does not generate CUDA (arch is for CUDA backends)")
        return None
    from kernforge.backends.cuda.arch import ARCHS, DEFAULT_ARCH

    if arch is not None and arch not in ARCHS:
        raise ValueError(f"arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    return arch or backends.get(backend).target(launch=True).arch or DEFAULT_ARCH


def built_for(arch: Optional[str]) -> dict:
    """The ops' ``_kernel`` keyword for ``arch`` where the call named one (else the backend's
    default target, and the call's compile cache entry stays the one it had without ``arch``)."""
    return {} if arch is None else {"arch": arch}
