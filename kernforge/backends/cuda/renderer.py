"""The CUDA renderer: tile IR -> one ``extern "C" __global__`` kernel in CUDA C++.

How the tile program maps onto a thread block (DESIGN.md §1-2):

* grid -> ``blockIdx``; ``threads`` -> ``blockDim.x``; statements outside a
  ``Parallel`` act once per block: a store to shared or global memory is done
  by thread 0 (then a barrier), block-uniform locals live in every thread's
  registers and every thread computes them.
* fragments -> registers in the layout :mod:`kernforge.backends.cuda.layout_plan`
  chose, or shared memory when an access needs another thread's element.
  A ``Parallel`` map iterates each thread's own registers of its driving
  fragment (an unrolled loop over constant register indices); with no
  register fragment involved, the block's threads share the iterations.
* shared tiles -> one dynamic shared-memory arena; gemm operand tiles are
  stored 128-byte swizzled (sm_90a wgmma operands in whole 128-byte rows, each tile
  1024-byte aligned) or in 8x8 core-matrix order (:mod:`smem_layouts`), so ``ldmatrix``
  and ``wgmma`` read them without bank conflicts.
* copies global -> shared -> 16-byte ``cp.async`` chunks (scalar loads at
  edges); ``T.Pipelined`` -> a ``num_stages``-deep ring of those tiles
  (:mod:`kernforge.backends.cuda.pipeline_plan`), filled on sm_90a and sm_100a by TMA
  loads completing on one mbarrier per stage (:mod:`cuda_tma`; ``tma=False``
  renders the cp.async variant the launcher falls back to).
* gemm -> ``wgmma`` (sm_90a), ``tcgen05.mma`` into tensor memory (sm_100a, :mod:`tcgen05`) or
  ``mma.sync`` m16n8k16 (sm_80; sm_100a gemms tcgen05 does not take), or a scalar loop for
  dtypes and shapes the tensor cores do not take.
* barriers: ``ir.Sync`` statements, placed by the barrier pass
  (:mod:`kernforge.backends.cuda.barriers`, the last transform) where shared
  memory written since the last barrier is read, or read/written memory is
  about to be overwritten; the renderer emits them and infers none (the
  barriers inside one lowering's protocol, listed there, stay in it).

Every PTX instruction sits in a ``kf::`` function of the device library, so
the output also compiles for host emulation (``-DKF_HOST_EMULATION``).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from math import prod
from typing import Callable, Optional

import jinja2

from kernforge import dtypes
from kernforge.codegen import ir
from kernforge.backends.cuda.arch import Arch, CudaRenderError, arch_info
from kernforge.backends.cuda.layouts import AccumLayout
from kernforge.codegen.passes import Analysis, simplify
from kernforge.codegen.passes.checks import insert_checks
from kernforge.backends.cuda.barriers import barrier_pass
from kernforge.backends.cuda.fp8_operands import (cuda_fp8_operands, cuda_fp8_operands_tcgen05,
                                                  cuda_fp8_operands_wgmma)
from kernforge.backends.cuda.layout_plan import LayoutPlan, plan_layouts
from kernforge.backends.cuda.pipeline_plan import (PipelinePlan, plan_pipelines, plan_promotion_rings,
                                                   plan_release_rings, plan_warp_specialization)
from kernforge.backends.cuda import persistent as cuda_persistent, warp_specialize
from kernforge.backends.cuda import cluster as cuda_cluster, tcgen05_pair as cuda_tcgen05_pair
from kernforge.backends.cuda import seesaw as cuda_seesaw, smem_layouts
from kernforge.backends.cuda.smem_layouts import SMEM_ALIGN, SWIZZLE_ALIGN
from kernforge.backends.cuda import gemm as cuda_gemm, ops as cuda_ops, radix as cuda_radix, reduce as cuda_reduce, softmax as cuda_softmax, tcgen05 as cuda_tcgen05, tma as cuda_tma
from kernforge.backends.cuda import tma_store as cuda_tma_store
from kernforge.backends.templates import environment as template_environment
from kernforge.codegen.renderer import CRenderer, NameTable, Program, Renderer, Target, entry_symbol, safe_identifier

TEMPLATE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
INCLUDE_DIR = os.path.join(TEMPLATE_DIR, "include")
TENSOR_MAP_CTYPE = "const __grid_constant__ CUtensorMap"


# IR -> IR passes before rendering; ``CudaRenderer.pipeline`` appends the target's barrier pass,
# then the analyses read the result
TRANSFORMS = (simplify, cuda_fp8_operands)


def native_composites(kernel: ir.Kernel) -> tuple[type, ...]:
    """Composite tile ops this renderer lowers itself (to kf/ device helpers) instead of running
    their expansion; the radix helper uses warp collectives, so it needs a block of whole warps."""
    return (ir.OnlineSoftmax,) + ((ir.RadixFindBucket,) if kernel.threads % 32 == 0 else ())


@dataclass
class CudaProgram(Program):
    """A rendered kernel and what the host needs to launch it.

    ``params`` are ``(name, C type)`` in launch order: the kernel's parameters
    (buffers as pointers, scalars by value) then one ``int64_t`` per
    ``kernel.symbols`` entry, then one ``const __grid_constant__ CUtensorMap`` per
    entry of ``tensor_maps`` (TMA variant only; the launcher encodes them from the
    actual tensors with :func:`cuda_tma.encode_args`)."""

    params: list[tuple[str, str]]
    threads: int
    dynamic_smem: int
    arch: str
    tensor_maps: tuple = ()
    # the threads that run the main loop: all of them, or a warp-specialized kernel's consumers
    # (the SASS cycle model spreads the main loop's issue over their warps only)
    main_loop_threads: int = 0
    # a persistent kernel (cuda.persistent): launched on a 1-D grid of min(#blocks, #SMs) CTAs,
    # each looping over the logical grid's blocks
    persistent: bool = False
    # CTAs per thread-block cluster along x (cuda.cluster: TMA multicast of a shared operand); the
    # launchers round the grid's x extent up to whole clusters
    cluster: int = 1
    cluster_reason: str = ""  # why a kernel that asked for a cluster (attrs["cluster"]) has none
    cluster_axis: int = 0  # the grid axis the cluster spans and the launchers round: 0 (x, A shared), 1 (y, B)

    @property
    def variant(self) -> str:
        """``tma`` when the pipelines load through tensor maps, else ``cp.async``."""
        return "tma" if self.tensor_maps else "cp.async"


# scalar parameters narrower than 32 bits travel as 32-bit values (the launch packs 4/8-byte slots)
_SCALAR_ABI = {dtypes.bool_: "int32_t", dtypes.int8: "int32_t", dtypes.int16: "int32_t", dtypes.uint8: "uint32_t",
               dtypes.uint16: "uint32_t", dtypes.float16: "float", dtypes.bfloat16: "float",
               dtypes.float8_e4m3: "float"}


class CudaRenderer(CRenderer, Renderer):
    """``render(kernel, target) -> CudaProgram``; tile statements are lowered in :mod:`cuda_ops`.

    The transforms end with the barrier pass (``ir.Sync`` where blocks must synchronise), and
    the pipeline with three analyses the emitter reads: fragment ``layouts`` (which
    fragments live in registers, in which layout; which gemm instruction), the ``pipelines``
    (ring copies of each ``T.Pipelined`` loop) and ``tma`` (which of those rings load by
    TMA on sm_90a, and the tensor maps they need; none for the ``cp.async`` variant), then
    ``tma_store`` (which accumulator epilogues go out by STSM + TMA stores on sm_90a and sm_100a:
    :mod:`kernforge.backends.cuda.tma_store`) and the ring / warp-specialization plans."""

    name = "cuda"
    tid = "kf_tid"
    # T.rcp: one rcp.approx.ftz.f32 (kf/common.cuh) instead of an IEEE division with a slow-path call
    unary_table = {**CRenderer.unary_table,
                   ir.Op.RCP: lambda a, e: f"kf_rcp_approx({a})" if e.dtype == dtypes.float32 else f"(1.0 / {a})"}

    def pipeline(self, kernel: ir.Kernel, target: Target) -> tuple:
        arch = arch_info(target.arch)
        tma = arch.tma and target.variant != "cp.async"
        # checked mode tests the author's accesses, before fp8 shadow tiles and barriers exist
        transforms = TRANSFORMS[:1] + (insert_checks,) + TRANSFORMS[1:] if target.checks else TRANSFORMS
        if arch.wgmma or arch.tcgen05:  # native fp8 wgmma / tcgen05 kind::f8f6f4 where it applies
            native = cuda_fp8_operands_wgmma if arch.wgmma else cuda_fp8_operands_tcgen05
            transforms = tuple(native if t is cuda_fp8_operands else t for t in transforms)
        return transforms + (barrier_pass(arch.wgmma, tma, arch.tcgen05),) + (
            Analysis("layouts", lambda k, facts: plan_layouts(k, arch.wgmma, arch.tcgen05)),
            Analysis("pipelines", lambda k, facts: plan_pipelines(k, facts["layouts"].staged)),
            Analysis("tma", lambda k, facts: cuda_tma.plan_tma(k, facts["layouts"], facts["pipelines"])
                     if tma else ({}, [])),
            Analysis("tma_store", lambda k, facts: cuda_tma_store.plan_tma_stores(k, facts["layouts"], tma)),
            Analysis("release", lambda k, facts: plan_release_rings(facts["tma"][0], facts["layouts"])),
            Analysis("promotion", lambda k, facts: plan_promotion_rings(facts["tma"][0], facts["layouts"])),
            # MLA's two-warpgroup schedule of its attention loop (cuda.seesaw), filled by a producer
            Analysis("seesaw", lambda k, facts: cuda_seesaw.plan_seesaw(k, arch.wgmma, facts["tma"][0],
                                                                        facts["layouts"])),
            Analysis("warpspec", lambda k, facts: plan_warp_specialization(k, facts["pipelines"], facts["release"],
                                                                           facts["promotion"], facts["seesaw"])),
            Analysis("persistent", lambda k, facts: cuda_persistent.plan_persistent(
                k, facts["tma"][0], facts["release"], facts["warpspec"])),
            # TMA multicast (cuda.cluster), or a kernel's 2-CTA tcgen05 MMA pair (cuda.tcgen05_pair)
            Analysis("cluster", lambda k, facts: cuda_tcgen05_pair.plan_cluster(k, arch.name, facts)),
        )

    def native(self, kernel: ir.Kernel, target: Target) -> tuple[type, ...]:
        return native_composites(kernel)

    def emit_program(self, kernel: ir.Kernel, facts: dict, target: Target) -> CudaProgram:
        self.setup(kernel, arch_info(target.arch), facts)
        self.checks = target.checks
        return self.render_body()

    def cname(self, node) -> str:
        """The C identifier of a variable or buffer: the author's (and the passes') names made
        safe (``codegen.renderer.safe_identifier``); the names this renderer generates with
        :meth:`fresh` (``kf_i3``) as they are.  Author names are not deduplicated: the CUDA
        source keeps the DSL's block scoping, so equal names in sibling scopes do not clash."""
        return safe_identifier(node.name) if node in self.author_names else node.name

    def setup(self, kernel: ir.Kernel, arch: Arch, facts: dict) -> None:
        self.k = kernel
        self.arch = arch
        self.author_names = NameTable.for_kernel(kernel)
        self.plan: LayoutPlan = facts["layouts"]
        self.pipes: PipelinePlan = facts["pipelines"]
        self.tma_loops, self.tensor_maps = facts["tma"]
        self.tma_stores, store_maps = facts.get("tma_store", ({}, []))  # STSM + TMA-store epilogues
        self.tensor_maps = list(self.tensor_maps) + list(store_maps)
        self.tma_store_offset = -1
        self.release_rings: set = facts.get("release", set())  # full + empty mbarriers, wgmma_wait<1>
        self.wgmma_keep = 0  # wgmma groups a gemm leaves in flight (1 inside a release ring)
        self.warp_spec = facts.get("warpspec")  # a producer warpgroup fills the release rings
        # the seesaw schedule of an attention loop, which needs the producer warpgroup
        self.seesaw = facts.get("seesaw") if self.warp_spec is not None else None
        self.seesaw_offset = -1
        self.persistent = facts.get("persistent")  # a persistent tile loop (cuda.persistent)
        self.ring_base: dict[ir.For, str] = {}  # persistent: each ring's running iteration count
        # a 2-CTA cluster sharing one ring tile by TMA multicast (cuda.cluster), and why not if asked
        self.cluster, self.cluster_reason = facts.get("cluster") or (None, "")
        if self.cluster is not None:  # the shared tile's map boxes one CTA's slice
            self.tma_loops, self.tensor_maps = cuda_cluster.apply(self.cluster, self.tma_loops, self.tensor_maps)
        self.mbarrier_offsets: dict[ir.For, int] = {}
        self.lines: list[str] = []
        self.depth = 1
        self.var_override: dict[ir.Var, str] = {}
        self.buf_override: dict[ir.Buffer, str] = {}
        self.reg_ctx: Optional[tuple] = None  # (driver layout, register index name, loop vars)
        self.in_parallel = False
        # wgmma and tcgen05.mma read their operands through the async proxy
        self.uses_wgmma = bool({"wgmma", "tcgen05"} & set(self.plan.gemm_kind.values()))
        self.tmem_slot_offset = -1
        self.tmem_live: dict[ir.Gemm, str] = {}  # TMEM-resident gemm -> its loop's "TMEM written" flag
        self.headers: set[str] = set()
        self.smem_offsets: dict[ir.Buffer, int] = {}
        self.smem_bytes = 0
        self.scratch_offset = -1
        self.scan_scratch_offset = -1
        self.softmax_scratch_offset = -1
        self.counter = 0
        self.nonneg_vars = set(kernel.block_vars) | set(kernel.symbols)

    # -- names --------------------------------------------------------------
    def var_name(self, v: ir.Var) -> str:
        return self.var_override.get(v) or self.cname(v)

    def buffer_name(self, b: ir.Buffer) -> str:
        return self.buf_override.get(b) or self.cname(b)

    def fresh(self, base: str) -> str:
        self.counter += 1
        return f"kf_{base}{self.counter}"

    def is_smem(self, b: ir.Buffer) -> bool:
        return b.scope == ir.Scope.SHARED or b in self.plan.staged

    # -- element access -------------------------------------------------------
    def offset(self, buf: ir.Buffer, indices) -> str:
        if self.is_smem(buf) and buf in self.plan.core_tiles:  # core-matrix or 128B-swizzled order
            r, c = (self.expr(i) for i in indices)
            return smem_layouts.element_offset(buf.static_shape(), buf.dtype.itemsize, buf in self.plan.swizzled,
                                               r, c)
        return super().offset(buf, indices)

    def load(self, e: ir.Load) -> str:
        if e.buffer in self.plan.registers:
            return self.reg_ref(e.buffer, e.indices)
        return super().load(e)

    def expr(self, e: ir.Expr) -> str:
        if isinstance(e, ir.Shuffle):
            # the thread map gives iteration tx to thread tx (one iteration each), so the
            # calling lane is the shuffle's thread and the whole warp reaches the call; a map
            # driven by a register fragment's layout, or run whole by every thread, would not
            if not self.in_parallel or self.reg_ctx is not None:
                raise CudaRenderError("a warp shuffle in a thread region that is not one iteration per "
                                      "thread (a register fragment indexed by the thread drives it, or "
                                      "it stores to a block-uniform local)", self.k.loc)
            fn = {"xor": "__shfl_xor_sync", "down": "__shfl_down_sync", "up": "__shfl_up_sync",
                  "idx": "__shfl_sync"}[e.kind]
            # a block of fewer than 32 threads is one partial warp: the member mask names its lanes
            mask = "0xffffffffu" if self.k.threads >= 32 else f"{hex((1 << self.k.threads) - 1)}u"
            return f"{fn}({mask}, ({self.ctype(e.dtype)})({self.expr(e.value)}), {self.expr(e.arg)}, {e.width})"
        return super().expr(e)

    def reg_ref(self, b: ir.Buffer, indices) -> str:
        if self.reg_ctx is None:
            raise CudaRenderError(f"register fragment {self.cname(b)} accessed outside its owner's loop (planner bug)")
        driver, r, vars_ = self.reg_ctx
        lay = self.plan.registers[b]
        if lay == driver and all(i is v for i, v in zip(indices, vars_)):
            return f"{self.buffer_name(b)}[{r}]"
        if isinstance(driver, AccumLayout) and lay == driver.rows and indices[0] is vars_[0]:
            return f"{self.buffer_name(b)}[{driver.row_reg(r)}]"
        raise CudaRenderError(f"fragment {self.cname(b)} accessed at {indices} in a loop driven by {driver} "
                              "(planner bug)")

    # -- output ---------------------------------------------------------------
    def emit(self, line: str) -> None:
        self.lines.append("  " * self.depth + line)

    def open(self, head: str) -> None:
        self.emit(head + " {")
        self.depth += 1

    def close(self, tail: str = "}") -> None:
        self.depth -= 1
        self.emit(tail)

    # -- barriers -----------------------------------------------------------------
    def barrier(self) -> None:
        """A block barrier (an ``ir.Sync``, or one inside a lowering's own protocol); with wgmma,
        generic-proxy writes to shared memory are also fenced for the async proxy."""
        if self.warp_spec is not None:  # the producer warpgroup is not in the consumers' barriers
            self.emit(warp_specialize.consumer_barrier(self))
            return
        self.emit("kf::fence_proxy_async(); __syncthreads();" if self.uses_wgmma else "__syncthreads();")

    def release(self, bar: str) -> str:
        """A consumer thread's release of a ring stage: one arrival on the stage's empty barrier, on
        every CTA's copy in a cluster (each CTA's multicast writes the stage in all of them)."""
        if self.cluster is None:
            return f"kf::mbarrier_arrive({bar});"
        return (f"for (uint32_t kf_r = 0; kf_r < {self.cluster.plan.size}u; ++kf_r) "
                f"kf::mbarrier_arrive_cluster({bar}, kf_r);")

    # -- kernel ---------------------------------------------------------------------
    def allocate_smem(self) -> None:
        off = 0
        for n in ir.nodes(self.k.body):
            if isinstance(n, ir.Allocate) and self.is_smem(n.buffer) and n.buffer not in self.smem_offsets:
                b = n.buffer
                if b in self.plan.swizzled:  # each stage is a whole number of 1024-byte atoms
                    off = -(-off // SWIZZLE_ALIGN) * SWIZZLE_ALIGN
                self.smem_offsets[b] = off
                off += -(-prod(b.static_shape()) * b.dtype.itemsize * self.pipes.stages.get(b, 1)
                         // SMEM_ALIGN) * SMEM_ALIGN
        for loop in self.tma_loops:
            self.mbarrier_offsets[loop] = off
            released = loop in self.release_rings or (self.warp_spec is not None and loop in self.warp_spec.rings)
            bars = loop.num_stages * (2 if released else 1)  # full (+ empty) per stage
            if self.seesaw is not None and loop is self.seesaw.loop:
                bars += cuda_seesaw.BARRIERS
            off += -(-8 * bars // SMEM_ALIGN) * SMEM_ALIGN
        if self.plan.tmem_columns():  # the TMEM address tcgen05.alloc writes, then the MMA mbarrier
            self.tmem_slot_offset = off  # (and block-scaled gemms' scale-byte staging after them)
            off += SMEM_ALIGN + -(-cuda_tcgen05.staging_bytes(self.plan) // SMEM_ALIGN) * SMEM_ALIGN
        scratch = max((cuda_reduce.reduce_scratch_floats(self, r) for r in ir.nodes(self.k.body)
                       if isinstance(r, ir.Reduce)), default=0)
        if scratch:
            self.scratch_offset = off
            off += -(-scratch * 4 // SMEM_ALIGN) * SMEM_ALIGN
        if self.seesaw is not None:
            self.seesaw_offset = off
            off += cuda_seesaw.EXCHANGE_FLOATS * 4
        softmax = max((cuda_softmax.scratch_floats(self, s) for s in ir.nodes(self.k.body)
                       if isinstance(s, ir.OnlineSoftmax)
                       and (self.seesaw is None or s is not self.seesaw.softmax)), default=0)
        if softmax:
            self.softmax_scratch_offset = off
            off += -(-softmax * 4 // SMEM_ALIGN) * SMEM_ALIGN
        if any((isinstance(c, ir.Cumsum) and cuda_reduce.block_scan_ok(self, c)) or isinstance(c, ir.RadixFindBucket)
               for c in ir.nodes(self.k.body)):
            self.scan_scratch_offset = off
            off += 32 * 8
        staging = cuda_tma_store.staging_bytes(self.tma_stores)
        drained = cuda_seesaw.drained_stage(self) if staging else None
        if drained is not None and staging <= drained[1]:
            self.tma_store_offset = drained[0]
        elif staging and -(-off // SWIZZLE_ALIGN) * SWIZZLE_ALIGN + staging <= self.arch.max_smem:
            self.tma_store_offset = off = -(-off // SWIZZLE_ALIGN) * SWIZZLE_ALIGN
            off += staging
        elif staging:  # no room for the staging tile: the plain epilogue, and no output tensor maps
            stores = {s.spec for s in self.tma_stores.values()}
            self.tensor_maps = [t for t in self.tensor_maps if t not in stores]
            self.tma_stores = {}
        self.smem_bytes = off
        if off > self.arch.max_smem:
            raise CudaRenderError(f"kernel {self.k.name} needs {off} bytes of shared memory; {self.arch.name} "
                                  f"allows {self.arch.max_smem} per block", self.k.loc)

    def params(self) -> list[tuple[str, str]]:
        out = []
        for p in self.k.params:
            if isinstance(p, ir.Buffer):
                out.append((self.cname(p), f"{self.ctype(p.dtype)}*"))
            else:
                out.append((self.cname(p) + "_arg" if p.dtype in _SCALAR_ABI else self.cname(p),
                            _SCALAR_ABI.get(p.dtype, self.ctype(p.dtype))))
        out += [(f"kf_dim_{self.cname(s)}", "int64_t") for s in self.k.symbols]
        if self.checks:  # checked mode's violation record (kf/check.cuh), before the tensor maps
            out.append(("kf_check", "int64_t*"))
        out += [(t.name, TENSOR_MAP_CTYPE) for t in self.tensor_maps]
        return out

    def prologue(self) -> None:
        self.emit(f"const int {self.tid} = threadIdx.x;")
        for axis, v in zip("xyz", self.k.block_vars if self.persistent is None else ()):  # else per tile
            self.emit(f"const {self.ctype(v.dtype)} {self.cname(v)} = ({self.ctype(v.dtype)})blockIdx.{axis};")
        for p in self.k.scalar_params:
            if p.dtype in _SCALAR_ABI:
                conv = (f"kf_from_float<{self.ctype(p.dtype)}>({self.cname(p)}_arg)" if p.dtype.is_float
                        else f"({self.ctype(p.dtype)}){self.cname(p)}_arg")
                self.emit(f"const {self.ctype(p.dtype)} {self.cname(p)} = {conv};")
        for s in self.k.symbols:
            self.emit(f"const {self.ctype(s.dtype)} {self.cname(s)} = ({self.ctype(s.dtype)})kf_dim_{self.cname(s)};")
        if self.cluster is not None:  # this CTA's slice of the cluster's arena under emulation
            self.emit("KF_CTA_SMEM(kf_smem);")
            self.emit("const uint32_t kf_cta_rank = kf::cluster_ctarank();")
        elif self.smem_bytes:
            aligned = self.plan.swizzled or self.tma_store_offset >= 0
            self.emit(f"extern __shared__ __align__({SWIZZLE_ALIGN if aligned else SMEM_ALIGN}) "
                      "unsigned char kf_smem[];")
        for b, off in self.smem_offsets.items():
            ring = "_ring" if b in self.pipes.stages else ""
            self.emit(f"{self.ctype(b.dtype)}* const {self.cname(b)}{ring} = "
                      f"reinterpret_cast<{self.ctype(b.dtype)}*>(kf_smem + {off});")
        if self.scratch_offset >= 0:
            self.emit(f"float* const kf_scratch = reinterpret_cast<float*>(kf_smem + {self.scratch_offset});")
        for i, off in enumerate(self.mbarrier_offsets.values()):
            self.emit(f"uint64_t* const kf_bars{i} = reinterpret_cast<uint64_t*>(kf_smem + {off});")
        if self.softmax_scratch_offset >= 0:
            self.emit(f"float* const kf_softmax_scratch = reinterpret_cast<float*>(kf_smem + {self.softmax_scratch_offset});")
        if self.scan_scratch_offset >= 0:
            self.emit(f"unsigned char* const kf_scan_scratch = kf_smem + {self.scan_scratch_offset};")
        if self.tmem_slot_offset >= 0:
            cuda_tcgen05.render_setup(self, self.tmem_slot_offset)

    def render_body(self) -> CudaProgram:
        self.allocate_smem()
        self.prologue()
        if self.persistent is not None:
            cuda_persistent.render_setup(self)
        if self.warp_spec is not None:
            warp_specialize.render_kernel_body(self)
        elif self.persistent is not None:
            cuda_persistent.render_tiles(self, lambda: self.stmt(self.k.body), consumers=True)
        else:
            self.stmt(self.k.body)
        if self.persistent is not None:
            cuda_tma_store.render_drain(self)  # the last tile's deferred TMA-store wait
            cuda_persistent.render_teardown(self)
        if self.tmem_slot_offset >= 0:
            cuda_tcgen05.render_teardown(self)
        for kind in set(self.plan.gemm_kind.values()):
            self.headers.add({"wgmma": "kf/wgmma.cuh", "mma": "kf/mma.cuh", "scalar": "kf/common.cuh",
                              "tcgen05": "kf/tcgen05.cuh"}[kind])
        if self.tma_loops or self.tmem_slot_offset >= 0:
            self.headers.add("kf/tma.cuh")
        if any(isinstance(n, ir.OnlineSoftmax) for n in ir.nodes(self.k.body)):
            self.headers.add("kf/softmax.cuh")
        if self.pipes.prefetch or any(isinstance(n, ir.Copy) for n in ir.nodes(self.k.body)):
            self.headers.add("kf/cp_async.cuh")
        self.headers |= {"kf/reduce.cuh", "kf/atomic.cuh"} | ({"kf/check.cuh"} if self.checks else set())
        if self.cluster is not None:
            self.headers.add("kf/cluster.cuh")
        params = self.params()
        entry = entry_symbol(self.k)
        threads = self.k.threads if self.warp_spec is None else self.warp_spec.threads
        source = _environment().get_template("kernel.cu.j2").render(
            name=self.k.name, arch=self.arch.name, threads=threads, dynamic_smem=self.smem_bytes,
            headers=sorted(self.headers - {"kf/common.cuh"}), entry=entry,
            attributes=self.cluster.plan.attribute + " " if self.cluster is not None else "",
            params=", ".join(f"{t} {n}" for n, t in params), body=self.lines)
        return CudaProgram(source, entry, params, threads, self.smem_bytes, self.arch.name,
                           tuple(self.tensor_maps), self.k.threads, self.persistent is not None,
                           1 if self.cluster is None else self.cluster.plan.size, self.cluster_reason,
                           0 if self.cluster is None else self.cluster.plan.axis)

    # -- statements -----------------------------------------------------------------
    def stmt(self, s: ir.Stmt) -> None:
        if self.warp_spec is not None and s in self.warp_spec.rings:  # the consumers' side of the ring
            warp_specialize.render_consumer_ring(self, s)
            return
        if isinstance(s, ir.Parallel) and cuda_tcgen05.folded(self, s):  # the block-scaled MMAs do it
            return
        if isinstance(s, ir.For) and s in self.plan.tmem_resident.values() and not self.in_parallel:
            cuda_tcgen05.render_resident_loop(self, s, lambda: HANDLERS[ir.For](self, s))
            return
        HANDLERS[type(s)](self, s)


HANDLERS: dict[type, Callable] = {
    ir.Seq: cuda_ops.render_seq, ir.Sync: cuda_ops.render_sync, ir.Allocate: cuda_ops.render_allocate, ir.Store: cuda_ops.render_store,
    ir.Atomic: cuda_ops.render_atomic, ir.If: cuda_ops.render_if, ir.For: cuda_ops.render_for,
    ir.Parallel: cuda_ops.render_parallel, ir.Copy: cuda_ops.render_copy, ir.Fill: cuda_ops.render_fill,
    ir.Gemm: cuda_gemm.render_gemm, ir.Reduce: cuda_reduce.render_reduce, ir.Cumsum: cuda_reduce.render_cumsum,
    ir.OnlineSoftmax: cuda_softmax.render_online_softmax, ir.RadixFindBucket: cuda_radix.render_find_bucket,
    # checked mode: every thread that reaches a failing check records it (the first one wins)
    ir.Check: lambda R, s: R.emit(R.check_call(s)),
}


@functools.lru_cache(maxsize=None)
def _environment() -> jinja2.Environment:
    """One environment for the process: it keeps its compiled templates (checking their files'
    times), where a new one per kernel compiled ``kernel.cu.j2`` again at every render."""
    return template_environment(TEMPLATE_DIR, keep_trailing_newline=True)


def render_cuda(kernel: ir.Kernel, arch: Optional[str] = None, tma: bool = True, checks: bool = False) -> CudaProgram:
    """Render ``kernel`` for ``arch`` (``sm_80``, ``sm_90a``, ``sm_100a``; default sm_90a).

    On sm_90a, ``tma`` (default) loads qualifying pipelined copies with TMA; ``tma=False``
    renders the cp.async variant, which the launchers run when a launch's tensors do not
    meet TMA's alignment rules (``cuda_tma.encode_args``); ``checks`` renders checked mode."""
    return CudaRenderer().render(kernel, Target("cuda", arch, "" if tma else "cp.async", checks))
