"""The CUDA targets the renderer knows (``sm_80``, ``sm_90a``, ``sm_100a``), what each has, and the
error of a kernel one of them cannot take.  A module of its own because the planners
(``cluster``, ``tcgen05_pair``), the backend and the ops ask about arches without rendering."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from kernforge.codegen import ir


@dataclass(frozen=True)
class Arch:
    name: str
    sm: int
    wgmma: bool
    max_smem: int  # bytes of shared memory one block may use (opt-in limit)
    tcgen05: bool = False  # 5th-generation tensor cores: tcgen05.mma into tensor memory (sm_100a)

    @property
    def tma(self) -> bool:
        """The copy engine (``cp.async.bulk.tensor``) and transaction-count mbarriers: sm_90a and later."""
        return self.wgmma or self.tcgen05

    @property
    def gencode(self) -> str:
        return f"-gencode=arch=compute_{self.name[3:]},code={self.name}"


ARCHS = {a.name: a for a in (Arch("sm_80", 80, False, 163 * 1024), Arch("sm_90a", 90, True, 227 * 1024),
                             Arch("sm_100a", 100, False, 227 * 1024, tcgen05=True))}
DEFAULT_ARCH = "sm_90a"


class CudaRenderError(ir.KernelError):
    """A kernel the CUDA backend cannot render (e.g. it needs more shared memory than the target has)."""


def arch_info(arch: Optional[str]) -> Arch:
    name = arch or DEFAULT_ARCH
    if name not in ARCHS:
        raise CudaRenderError(f"unknown CUDA arch {name!r}; supported: {', '.join(ARCHS)}")
    return ARCHS[name]
