"""Every library kernel runs on ascend-emu and matches its torch reference at the registry's
"small" size: on 910B (dav-c220) when the renderer can lower it there, else on 950
(dav-3510), and then the 910B refusal must be the one documented reason (no fp8 data type).

Taken from the registry at collection time, so a family registered later is covered (or
fails here) without editing this file.  Kernels that other files already run on the shim
are cache hits here when the suite shares a JIT cache."""
from __future__ import annotations

import pytest

from kernforge.backends.ascend.renderer import unsupported
from kernforge.kernels import registry
from kernforge.kernels.check import get_problem, run_spec

pytestmark = pytest.mark.usefixtures("shim_cxx")

SPECS = registry.all_specs()


def _arch(spec) -> str:
    """dav-c220 unless the renderer refuses the kernel there; only fp8 buffers may be refused."""
    kernel = spec.factory(**get_problem(spec, "small").params).ir
    why = unsupported(kernel, "dav-c220")
    if why is None:
        return "dav-c220"
    assert "no fp8 data type" in why, f"{spec.name} is refused on dav-c220 for an undocumented reason: {why}"
    assert unsupported(kernel, "dav-3510") is None, f"{spec.name} cannot be lowered on dav-3510 either"
    return "dav-3510"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_library_kernel_verifies_on_the_shim(name):
    spec = SPECS[name]
    assert "small" in spec.problems, f"{name} has no 'small' problem for the emulators"
    res = run_spec(spec, "ascend-emu", "small", repeat=1, seed=11, arch=_arch(spec))
    assert res.verified, res.error
    assert res.label == "verified on the Ascend C CPU shim"
