"""``kernforge build --report``: SASS instruction counts and a cycle model, without a GPU.

No GPU has been lent to this project, so nothing is timed; what the compiled code will cost
is read from its SASS (``cuobjdump -sass``).  This module parses that text into per-kernel
instruction lists, counts the instruction classes that decide a tensor-core kernel's speed
(MMA, TMA issue, conversions, barriers and waits, shared-memory access widths), finds the
kernel's *main loop* and estimates the fraction of the GPU's peak the kernel reaches on a
problem.  CI compares the counts (a serialized wgmma, a conversion loop, a lost ``QGMMA``
show up as numbers), so regressions are visible before a GPU ever runs the code.

The model (deliberately simple; every assumption is listed in ``MODEL_ASSUMPTIONS``):

* The **main loop** is the smallest loop (a backward branch's address range) that holds
  every tensor-core instruction; a kernel without MMA has none and gets no compute estimate.
  Its static instruction counts stand for one iteration.  Loops nested inside it (TMA-issue
  ``ELECT`` loops, element loops) are counted **once**, so with nested loops the issue time
  is a lower bound and the estimate an upper bound (``nested_loops`` says how many).
* One CTA per SM (the renderer's ``__launch_bounds__(threads, 1)``), ``warps`` warps spread
  over the SM's 4 schedulers (the warps that run the main loop: a warp-specialized kernel's
  producer warpgroup runs its own loop, ``CudaProgram.main_loop_threads``), one instruction per
  scheduler per cycle:
  ``issue = instructions * warps / 4`` cycles per iteration.  An MMA instruction counts in the
  issue time like any other (it is issued once per warp).
* Tensor-core cycles per iteration from the instruction shapes at the SM's dense peak
  (``PEAKS``): wgmma ``HGMMA.64xNx16`` and ``QGMMA.64xNx32`` take N/2 cycles; a warp's
  ``HMMA.16816`` takes 4096 / (flops per cycle of mma.sync) cycles per warp.
* The MMA pipe overlaps issue: ``compute = max(mma, issue) + waits * WAIT_LATENCY``, where
  ``waits`` counts ``WARPGROUP.DEPBAR`` (each drains the asynchronous MMA pipe) and
  ``BAR.SYNC`` in the main loop (each a block-wide stall); ``compute efficiency = mma / compute``.
* Memory runs at the full HBM bandwidth (no memory-level-parallelism model), so a
  memory-bound estimate is an upper bound.
* ``estimated time = max(flops / (rate * efficiency), bytes / bandwidth)`` with ``rate`` the
  peak of the MMA instructions the kernel uses; the fraction of peak is the ideal time
  ``max(flops / reference peak, bytes / bandwidth)`` over it, the reference being the peak of
  the problem's operand type (an fp8 problem on bf16 instructions reaches at most half).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

#: per-SM dense peaks and device figures the model uses (H200 for sm_90a, B200 for sm_100a,
#: A100 for sm_80).  flops/cycle/SM: bf16 wgmma (sm_90a: 989 TFLOPS / 132 SMs / 1.83 GHz = 4096),
#: fp8 wgmma twice that, legacy mma.sync half of the wgmma rate on Hopper (an assumption:
#: the ISA does not publish it).
PEAKS = {
    "sm_90a": {"device": "H200 SXM", "sms": 132, "clock_ghz": 1.83, "hbm_gbs": 4800.0,
               "flops_per_cycle": {"bf16": 4096, "fp8": 8192, "mma_sync": 2048}},
    "sm_100a": {"device": "B200", "sms": 148, "clock_ghz": 1.85, "hbm_gbs": 8000.0,
                "flops_per_cycle": {"bf16": 8192, "fp8": 16384, "mma_sync": 2048}},
    "sm_80": {"device": "A100 SXM", "sms": 108, "clock_ghz": 1.41, "hbm_gbs": 2039.0,
              "flops_per_cycle": {"bf16": 2048, "fp8": 2048, "mma_sync": 2048}},
}
#: cycles one wait on the MMA pipe (WARPGROUP.DEPBAR) or one block barrier costs on top of the
#: work (the wgmma pipeline latency order of magnitude; an assumption, not measured)
WAIT_LATENCY = 100

MODEL_ASSUMPTIONS = (
    "main loop = smallest loop holding every MMA; its static counts = one iteration",
    "loops nested in the main loop counted once (estimate is then an upper bound)",
    "one CTA per SM, warps over 4 schedulers, 1 instruction/scheduler/cycle",
    "HGMMA 64xNx16 / QGMMA 64xNx32: N/2 tensor cycles; HMMA.16816: 4096 flops at the mma.sync rate",
    "tcgen05 (UTCHMMA, no shape in SASS): the flops of one pass over the layout plan's tcgen05 gemms "
    "per main-loop iteration, at the bf16 rate",
    f"each WARPGROUP.DEPBAR or BAR.SYNC in the main loop adds {WAIT_LATENCY} cycles; MMA overlaps issue",
    "memory at full HBM bandwidth (no MLP model)",
)

_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Za-z0-9_.]*)\s*([^;]*);")
_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
_MMA_SHAPE = re.compile(r"^[HQ]GMMA\.(\d+)x(\d+)x(\d+)")


@dataclass(frozen=True)
class Instr:
    address: int
    opcode: str  # with modifiers: "HGMMA.64x128x16.F32.BF16"
    operands: str

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]


@dataclass
class SassKernel:
    name: str
    instrs: list[Instr] = field(default_factory=list)


def parse(sass: str) -> list[SassKernel]:
    """The kernels of a ``cuobjdump -sass`` listing, each with its instructions in order."""
    kernels: list[SassKernel] = []
    for line in sass.splitlines():
        m = _FUNCTION.match(line)
        if m:
            kernels.append(SassKernel(m.group(1)))
            continue
        m = _INSTR.match(line)
        if m and kernels:
            kernels[-1].instrs.append(Instr(int(m.group(1), 16), m.group(3), m.group(4).strip()))
    if not kernels:
        raise ValueError("no 'Function :' section in the SASS listing (not cuobjdump -sass output?)")
    return kernels


#: sm_100a tcgen05.mma as cuobjdump 13 names them: kind::f16 (``UTCHMMA``), kind::f8f6f4
#: (``UTCQMMA``), block-scaled and other kinds (``UTCOMMA``, ``UTCIMMA``)
UTC_MMA = ("UTCHMMA", "UTCQMMA", "UTCOMMA", "UTCIMMA")


def is_mma(i: Instr) -> bool:
    """A tensor-core instruction the renderer emits (wgmma bf16/f16 and e4m3, mma.sync, tcgen05.mma)."""
    return i.base in ("HGMMA", "QGMMA", "HMMA") + UTC_MMA


def counts(instrs: list[Instr]) -> dict[str, int]:
    """Instruction classes, by the SASS opcode (static counts)."""
    c = {"instructions": len(instrs), "mma_hgmma": 0, "mma_qgmma": 0, "mma_hmma": 0, "mma_utc": 0, "ldtm": 0,
         "tma_load": 0, "tma_store": 0, "ldgsts": 0, "f2fp": 0, "f2f": 0, "bar_sync": 0, "wgmma_arrive": 0,
         "wgmma_depbar": 0, "depbar": 0, "mbarrier": 0, "lds": 0, "lds_narrow": 0, "ldsm": 0, "sts": 0,
         "sts_narrow": 0, "stsm": 0, "ldg": 0, "stg": 0, "stg_narrow": 0, "calls": 0}
    for i in instrs:
        op, base = i.opcode, i.base
        if base == "HGMMA":
            c["mma_hgmma"] += 1
        elif base == "QGMMA":
            c["mma_qgmma"] += 1
        elif base == "HMMA":
            c["mma_hmma"] += 1
        elif base in UTC_MMA:
            c["mma_utc"] += 1
        elif base == "LDTM":  # tcgen05.ld: an accumulator read back from tensor memory
            c["ldtm"] += 1
        elif base == "UTMALDG":
            c["tma_load"] += 1
        elif base == "UTMASTG":
            c["tma_store"] += 1
        elif base == "LDGSTS":
            c["ldgsts"] += 1
        elif base == "F2FP":
            c["f2fp"] += 1
        elif base == "F2F":
            c["f2f"] += 1
        elif base == "BAR":
            c["bar_sync"] += 1
        elif op.startswith("WARPGROUP.ARRIVE"):
            c["wgmma_arrive"] += 1
        elif op.startswith("WARPGROUP.DEPBAR"):
            c["wgmma_depbar"] += 1
        elif base in ("DEPBAR", "LDGDEPBAR"):
            c["depbar"] += 1
        elif base == "SYNCS":
            c["mbarrier"] += 1
        elif base == "LDSM":
            c["ldsm"] += 1
        elif base == "STSM":
            c["stsm"] += 1
        elif base == "LDS":
            c["lds"] += 1
            c["lds_narrow"] += _narrow(op)
        elif base == "STS":
            c["sts"] += 1
            c["sts_narrow"] += _narrow(op)
        elif base == "LDG":
            c["ldg"] += 1
        elif base == "STG":
            c["stg"] += 1
            c["stg_narrow"] += not any(w in op.split(".") for w in ("64", "128"))
        elif base == "CALL":  # subroutine calls: the IEEE division / sqrt slow paths
            c["calls"] += 1
    return c


def _narrow(op: str) -> int:
    """1 for a shared access under 4 bytes (.U8/.S8/.U16/.S16): the byte/halfword stores of an
    element-wise conversion, 4 lanes to a bank word (bank-conflict and issue prone)."""
    return int(any(w in op.split(".") for w in ("U8", "S8", "U16", "S16")))


def loops(instrs: list[Instr]) -> list[tuple[int, int]]:
    """(first, last) address of every loop: a branch to an address at or before itself."""
    out = []
    for i in instrs:
        if i.base == "BRA":
            m = re.search(r"0x([0-9a-f]+)", i.operands)
            if m and int(m.group(1), 16) <= i.address:
                out.append((int(m.group(1), 16), i.address))
    return out


def main_loop(instrs: list[Instr]) -> Optional[tuple[int, int]]:
    """The smallest loop that holds every MMA instruction, or None (no MMA, or an MMA outside
    every loop: then the kernel runs its MMAs once and there is no steady state)."""
    mma = [i.address for i in instrs if is_mma(i)]
    if not mma:
        return None
    lo, hi = min(mma), max(mma)
    # not the elect-one retry loop ptxas wraps around a single-thread tcgen05.mma (ELECT ...
    # BRA.U.ANY): with one MMA per iteration it would be the smallest loop holding it
    elect = {i.address for i in instrs if i.opcode.startswith("BRA.U.ANY")}
    holding = [(a, b) for a, b in loops(instrs) if a <= lo and hi <= b and b not in elect]
    return min(holding, key=lambda r: r[1] - r[0]) if holding else None


def mma_cycles(i: Instr, arch: str) -> float:
    """Tensor-core cycles of one MMA instruction at the SM's dense peak (see ``PEAKS``)."""
    fpc = PEAKS[arch]["flops_per_cycle"]
    m = _MMA_SHAPE.match(i.opcode)
    if m:
        mm, n, k = (int(x) for x in m.groups())
        return 2.0 * mm * n * k / (fpc["fp8"] if i.base == "QGMMA" else fpc["bf16"])
    if i.base == "HMMA":  # HMMA.16816.F32.BF16 (m16n8k16) or HMMA.1688 (m16n8k8)
        k = 8 if i.opcode.startswith("HMMA.1688") else 16
        return 2.0 * 16 * 8 * k / fpc["mma_sync"]
    return 0.0


def model(kernel: SassKernel, arch: str, threads: int, flops: Optional[float], nbytes: Optional[float],
          operands: str = "bf16", utc_flops: float = 0.0) -> dict:
    """The cycle model of the module docstring for one kernel on one problem.  ``operands``
    ("bf16" or "fp8"): the problem's operand type, whose tensor-core peak is the reference,
    so an fp8 problem run on bf16 instructions reaches at most half of its peak."""
    if arch not in PEAKS:
        raise ValueError(f"no peak figures for arch {arch!r}; known: {', '.join(PEAKS)}")
    peak = PEAKS[arch]
    warps = max(1, threads // 32)
    out: dict = {"device": peak["device"], "assumptions": list(MODEL_ASSUMPTIONS)}
    rng = main_loop(kernel.instrs)
    body = [i for i in kernel.instrs if rng and rng[0] <= i.address <= rng[1]]
    nested = [r for r in loops(kernel.instrs) if rng and r != rng and rng[0] <= r[0] and r[1] <= rng[1]]
    dtype = "fp8" if any(i.base in ("QGMMA", "UTCQMMA") for i in body) else "bf16"
    sync_rate = not any(i.base in ("HGMMA", "QGMMA") for i in kernel.instrs) and any(i.base == "HMMA"
                                                                                     for i in kernel.instrs)
    fpc = peak["flops_per_cycle"]["mma_sync" if sync_rate else dtype]
    peak_tflops = fpc * peak["sms"] * peak["clock_ghz"] / 1e3
    out.update({"mma_dtype": "mma.sync" if sync_rate else dtype, "peak_tflops": round(peak_tflops, 1),
                "hbm_gbs": peak["hbm_gbs"]})
    if rng is not None:
        mma = sum(mma_cycles(i, arch) for i in body)
        if any(i.base in UTC_MMA for i in body):  # tcgen05: one pass over its gemms per iteration
            mma += utc_flops / peak["flops_per_cycle"][dtype]
        issue = len(body) * warps / 4.0
        waits = sum(1 for i in body if i.opcode.startswith("WARPGROUP.DEPBAR") or i.base == "BAR")
        compute = max(mma, issue) + waits * WAIT_LATENCY
        out["main_loop"] = {"address": f"{rng[0]:#x}-{rng[1]:#x}", "instructions": len(body),
                            "mma_instructions": sum(1 for i in body if is_mma(i)),
                            "tmem_loads": sum(1 for i in body if i.base == "LDTM"), "nested_loops": len(nested),
                            "mma_cycles": round(mma, 1), "issue_cycles": round(issue, 1), "waits": waits,
                            "cycles": round(compute, 1)}
        eff = mma / compute if compute else 0.0
        out["compute_efficiency"] = round(eff, 3)
    else:
        eff = 0.0
    if flops is None or nbytes is None:
        return out
    ref_tflops = peak["flops_per_cycle"][operands] * peak["sms"] * peak["clock_ghz"] / 1e3
    t_ideal_compute = flops / (ref_tflops * 1e12)
    t_memory = nbytes / (peak["hbm_gbs"] * 1e9)
    ideal = max(t_ideal_compute, t_memory)
    est = max(flops / (peak_tflops * 1e12 * eff) if eff else float("inf"), t_memory)
    out.update({"flops": flops, "bytes": nbytes, "reference_tflops": round(ref_tflops, 1),
                "ideal_us": round(ideal * 1e6, 2), "bound": "compute" if t_ideal_compute >= t_memory else "memory",
                "estimated_us": round(est * 1e6, 2) if est != float("inf") else None,
                "fraction_of_peak": round(ideal / est, 3) if est != float("inf") else None})
    return out
