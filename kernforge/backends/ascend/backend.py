"""Backend "ascend": Ascend C for 910B/A3 (dav-c220) and 950 (dav-3510), built with bisheng.

No NPU exists where kernforge is developed, so this backend renders (``kernforge emit``),
reports the on-chip memory plan and compiles with bisheng when it is installed
(``kernforge build --backend ascend``), but it does not launch: ``target(launch=True)``
and ``build`` raise :class:`BackendError`.  The semantics of what it renders are verified
by the ``ascend-emu`` backend, which compiles the same source with g++ against a CPU shim
of the Ascend C API (``backends/ascend_emu``): "verified on the Ascend C CPU shim", never
"NPU verified".

:func:`host_source` is the host side of a real launch (ACL: ``aclrtBinaryLoadFromFile``,
``aclrtBinaryGetFunction``, ``aclrtLaunchKernel`` with the packed parameters); it is checked
with ``g++ -fsyntax-only`` against the ACL headers when they are available (torch-npu's
wheel ships them under ``torch_npu/include/acl``).
"""
from __future__ import annotations

import os
import shutil
from typing import Optional


from kernforge.backends.ascend.renderer import (DEFAULT_ARCH, INCLUDE_DIR, TEMPLATE_DIR, AscendProgram,
                                                AscendRenderer, arch_info)
from kernforge.backends.base import Backend, BackendError
from kernforge.backends.templates import environment as template_environment
from kernforge.codegen import ir
from kernforge.codegen.renderer import Target

DEPENDENCY_SIGNATURE = "kernforge-ascend-device-library/1"


def bisheng_available() -> Optional[str]:
    """bisheng's path when it can be found (``KERNFORGE_JIT_BISHENG``, ``$ASCEND_HOME_PATH``, PATH)."""
    from kernforge.runtime.config import ascend_home

    configured = os.environ.get("KERNFORGE_JIT_BISHENG")
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    home = ascend_home()
    if home:
        for rel in ("compiler/ccec_compiler/bin/bisheng", "bin/bisheng"):
            if os.access(os.path.join(home, rel), os.X_OK):
                return os.path.join(home, rel)
    return shutil.which("bisheng")


def compile_options(program: AscendProgram) -> tuple[str, ...]:
    """bisheng options of a device compile of ``program`` (see runtime.compilers.bisheng)."""
    from kernforge.runtime.compilers.bisheng import arch_options

    return arch_options(program.arch) + (f"-D__NPU_ARCH__={program.npu_arch}",)


_HOST_ENV = template_environment(TEMPLATE_DIR, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def host_source(program: AscendProgram) -> str:
    """The ACL host launcher of ``program``: loads the device binary, packs the parameters in
    declaration order (GM pointers, scalars, int64 symbols) and calls ``aclrtLaunchKernel``."""
    return _HOST_ENV.get_template("host_launch.cpp.j2").render(
        entry=program.entry, kernel_name=program.kernel_name, params=program.params, arch=program.arch,
        workspace_group_bytes=program.workspace_group_bytes)


class AscendBackend(Backend):
    renderer = AscendRenderer()
    verified_label = "not run (no NPU)"

    def target(self, arch: Optional[str] = None, launch: bool = False) -> Target:
        info = arch_info(arch)
        if launch:
            raise BackendError("backend 'ascend' cannot launch here: no Ascend NPU runtime is available "
                               "(use --backend ascend-emu to run the same Ascend C source on the CPU shim)")
        return Target(self.name, info.name)

    def build(self, kernel: ir.Kernel, target: Optional[Target] = None):
        raise BackendError("backend 'ascend' has no NPU launcher in this version; `kernforge build --backend ascend` "
                           "compiles and reports, `--backend ascend-emu` runs the source on the CPU shim")

    def build_report(self, kernel: ir.Kernel, arch: Optional[str] = None) -> dict:
        """The on-chip plan buffer by buffer: the AIV's UB plan and, for kernels with ``T.gemm``
        (MIX: one AIC + two AIV per group), the AIC's L1/L0A/L0B/L0C pools per gemm and the GM
        workspace; then the bisheng object when bisheng is installed (else why it was not compiled)."""
        info = arch_info(arch or DEFAULT_ARCH)
        program = self.render(kernel, self.target(info.name))
        used = {m: 0 for m in ("L1", "L0A", "L0B", "L0C")}
        for memory, _, offset, size in program.usage:
            if memory in used:
                used[memory] = max(used[memory], offset + size)
        report = {"arch": f"{info.name} (__NPU_ARCH__ {info.npu_arch})",
                  "kernel type": "MIX (1 AIC + 2 AIV per group)" if program.mix else "AIV only",
                  "UB used": f"{program.ub_bytes} / {info.ub} bytes"}
        for memory in used:
            report[f"{memory} used"] = f"{used[memory]} / {info.capacity(memory)} bytes"
        if program.mix and program.direct_cv:
            report["cube hand-off"] = "direct: A, B UB -> L1 (DataCopy Nd2Nz), C L0C -> UB (Fixpipe)"
            report["GM workspace"] = f"{program.workspace_group_bytes} bytes per group (op words only)"
        elif program.mix:
            report["cube hand-off"] = "GM workspace: A, B UB -> GM -> L1, C L0C -> GM -> UB"
            report["GM workspace"] = f"{program.workspace_group_bytes} bytes per group"
        for memory, name, offset, size in program.usage:
            report[f"{memory} {name}"] = f"{size} bytes at {offset}"
        binary = bisheng_available()
        if binary is None:
            report["compiled"] = "no: bisheng not found (KERNFORGE_JIT_BISHENG, $ASCEND_HOME_PATH, PATH)"
            return report
        from kernforge import runtime

        tag = f"ascend_{kernel.artifact_name}_{info.name.replace('-', '_')}"
        result = runtime.compile_without_load(tag, program.source, backend="ascend", options=compile_options(program),
                                              include_dirs=(INCLUDE_DIR,), dependency_signature=DEPENDENCY_SIGNATURE)
        report["compiled"] = result.binary_path
        return report
