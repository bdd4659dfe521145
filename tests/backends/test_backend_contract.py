"""The backend contract every backend follows: one table, render(kernel, target) -> Program with a
dumped and verified pipeline, get_kernel_source() showing what was built, identifiers made safe on
every C-like target, and codegen/ free of the JIT and the runtime."""
from __future__ import annotations

import ast
import io
from pathlib import Path

import pytest
import torch

import kernforge
import kernforge.dsl as T
from kernforge import backends
from kernforge.codegen import ir
from kernforge.codegen.passes import Analysis, PassError, run_pipeline, simplify
from kernforge.codegen.renderer import Program, Target
from tests.conftest import backend_param

KERNFORGE = Path(kernforge.__file__).resolve().parent


def axpy():
    N = T.symbolic("N")

    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), delete: T.Tensor((N,), "float32"), threadIdx: T.float32):
        with T.Kernel(T.ceildiv(N, 64), threads=64) as bx:
            kf_tid = T.alloc_fragment((64,), "float32")
            T.copy(X[bx * 64], kf_tid)
            for i in T.Parallel(64):
                kf_tid[i] = kf_tid[i] * threadIdx + 1.0
            T.copy(kf_tid, delete[bx * 64])
    return main


def test_codegen_imports_neither_the_jit_nor_the_runtime_nor_a_backend():
    offenders = []
    for path in (KERNFORGE / "codegen").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(KERNFORGE)}: {n}" for n in names
                          if n.startswith(("kernforge.jit", "kernforge.runtime", "kernforge.backends"))]
    assert offenders == []


def test_no_module_outside_the_table_branches_on_a_tensors_device():
    """The table replaces `"cuda" if x.is_cuda else "cpu"` everywhere."""
    hits = [str(p.relative_to(KERNFORGE)) for p in KERNFORGE.rglob("*.py")
            if "model" not in p.parts and ('if a.is_cuda' in p.read_text() or '.is_cuda else' in p.read_text())]
    assert hits == []


def test_the_table_gives_devices_languages_and_defaults():
    assert backends.for_tensor(torch.empty(2)) == "cpu"
    assert backends.for_tensor(torch.empty(2), "cuda-emu") == "cuda-emu"
    assert backends.for_device("cuda") == "cuda" and backends.for_device("npu") == "ascend"
    assert [backends.device(n) for n in ("interp", "cpu", "cuda-emu", "cuda")] == ["cpu", "cpu", "cpu", "cuda"]
    assert backends.lang("cuda-emu") == backends.lang("cuda") == "cuda"
    with pytest.raises(backends.BackendError, match="no kernforge backend takes 'xpu'"):
        backends.for_device("xpu")
    with pytest.raises(backends.BackendError, match="unknown backend 'cdua'.*known: .*cuda"):
        backends.for_tensor(torch.empty(1), "cdua")
    # ascend renders (its semantics run on ascend-emu) but cannot launch without an NPU
    assert backends.lang("ascend") == backends.lang("ascend-emu") == "ascend-c"
    with pytest.raises(backends.BackendError, match="'ascend' cannot launch here.*ascend-emu"):
        backends.get("ascend").target(launch=True)


@pytest.mark.parametrize("name", ["interp", "cpu", "cuda", "cuda-emu"])
def test_every_backend_renders_a_program_through_a_dumped_pipeline(name):
    backend = backends.get(name)
    stream = io.StringIO()
    program = backend.render(axpy().ir, backend.target(), dump=stream)
    assert isinstance(program, Program) and program.source and program.entry
    dumped = stream.getvalue()
    expected = {"interp": [], "cpu": ["# after simplify", "# analysis memory"],
                "cuda": ["# after cuda_fp8_operands", "# analysis layouts", "# analysis tma"],
                "cuda-emu": ["# after simplify", "# analysis pipelines"]}[name]
    assert all(e in dumped for e in expected), dumped[:300]


def test_verification_names_the_broken_pass_and_analyses_must_come_last():
    kernel = axpy().ir

    class DropAllocations(ir.Mutator):
        def visit_Allocate(self, node):
            return ir.Seq(())

    def drop_allocations(k: ir.Kernel) -> ir.Kernel:  # a broken pass: the tile is used, never allocated
        return k.with_body(DropAllocations().visit(k.body))

    with pytest.raises(PassError, match="pass drop_allocations produced invalid IR: buffer 'kf_tid' used out of scope"):
        run_pipeline(kernel, [simplify, drop_allocations])
    with pytest.raises(PassError, match="pass simplify follows analysis count"):
        run_pipeline(kernel, [Analysis("count", lambda k, f: 1), simplify])
    facts = {}
    run_pipeline(kernel, [simplify, Analysis("count", lambda k, f: 7)], facts=facts)
    assert facts == {"count": 7}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a", "sm_100a"])
def test_cuda_sanitizes_identifiers_as_the_cpu_does(arch):
    src = backends.get("cuda").render(axpy().ir, Target("cuda", arch)).source
    for unsafe in ("* delete,", " threadIdx_arg", "float* delete)"):
        assert unsafe not in src
    assert "delete_" in src and "threadIdx_" in src and "kf_tid_" in src


@pytest.mark.parametrize("name", [backend_param("cpu"), backend_param("cuda-emu")])
def test_reserved_parameter_names_compile_and_run(name):
    kernel = kernforge.compile(axpy(), backend=name, arch="sm_80" if name == "cuda-emu" else None)
    x, out = torch.randn(100), torch.full((100,), float("nan"))
    kernel(x, out, 0.5)
    torch.testing.assert_close(out.double(), x.double() * 0.5 + 1.0)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_get_kernel_source_is_the_source_that_was_built(arch):
    from tests.conftest import host_backend_skip_reason

    if host_backend_skip_reason("cuda-emu"):
        pytest.skip(host_backend_skip_reason("cuda-emu"))
    kernel = kernforge.compile(axpy(), backend="cuda-emu", arch=arch)
    src = kernel.get_kernel_source()
    assert src is kernel.launcher.program.source
    assert src == backends.get("cuda-emu").render(axpy().ir, Target("cuda-emu", arch)).source
    assert f"kernel main for {arch} (" in src


@T.tunable(block=[32, 64])
def scaled_copy(block=32):
    N = T.symbolic("N")

    @T.prim_func
    def copy_kernel(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, block), threads=32) as bx:
            t = T.alloc_fragment((block,), "float32")
            T.copy(X[bx * block], t)
            T.copy(t, Y[bx * block])
    return copy_kernel


@pytest.mark.parametrize("name", [backend_param("cpu"), backend_param("cuda-emu")])
def test_variants_of_one_kernel_are_built_as_distinct_artifacts(name, monkeypatch):
    from kernforge import runtime

    tags, real = [], runtime.compile
    monkeypatch.setattr(runtime, "compile", lambda tag, *a, **k: (tags.append(tag), real(tag, *a, **k))[1])
    for block in (32, 64, 32):
        kernel = kernforge.compile(scaled_copy, backend=name, block=block)
        x, y = torch.randn(100), torch.full((100,), float("nan"))
        kernel(x, y)
        torch.testing.assert_close(y, x)
    assert len(tags) == 3 and tags[0] == tags[2] and tags[0] != tags[1]
    assert all(scaled_copy(block=b).artifact_name in t for t, b in zip(tags, (32, 64, 32)))


@pytest.mark.parametrize("name", ["interp", "cpu", "cuda-emu", "cuda"])
def test_a_backend_carries_its_table_line(name):
    backend, line = backends.get(name), backends.entry(name)
    assert (backend.name, backend.device, backend.lang) == (line.name, line.device, line.lang)
    assert backend.target().backend == name
