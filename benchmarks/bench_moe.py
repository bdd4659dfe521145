"""MoE permutation on kernforge against the reference model's torch path, side by side.

Usage::

    python benchmarks/bench_moe.py                       # T in {1, 64, 4096}, E=256, k=6, hidden 2048
    python benchmarks/bench_moe.py --hidden 1024 --repeat 21 --markdown

What is timed, per token count T (identity experts: the dispatch and combine around
the expert GEMMs, which both sides would share):

* **kernforge**: ``get_fused_mapping`` (sync path: the buffer is trimmed after a host
  read) + ``expand_to_fused`` (bf16 rows to the expert-major buffer, every padding row
  zeroed, as TileKernels' semantics require) + ``reduce_fused`` (weighted float32 sum back
  to the tokens).  The expanded buffer is held by the caller and reused from call to call
  (``expand_to_fused(..., out=)``), sized once for the worst case at that T, as a model's
  MoE layers would share one; ``--fresh-buffer`` allocates it on every call instead;
* **torch (model path)**: what :class:`kernforge.model.moe.MoE.forward` runs around its
  experts: per distinct routed expert, the rows naming it, ``index_select`` of their
  activations and ``index_add_`` of the weighted rows.

Routing is V4's gate on random logits (sqrt-softplus scores, a selection bias, the
chosen scores renormalised and scaled by 1.5): ``kernforge.ops.top2_sum_gate`` in the
kernforge column, :class:`kernforge.model.moe.Gate`'s torch ops (``topk`` of the biased
scores, ``gather``, divide) in the torch one; ``--torch-routing`` uses the torch routing in
both columns, which isolates the permutation.  Runs are interleaved (a b a b ...) and each
side's median is reported, with the ratio torch / kernforge (above 1: kernforge faster).
``--stages`` adds each kernforge op's median (a breakdown of the kernforge column).

The same run then times the FP8 x FP4 grouped GEMM (``--gemm-shape G ROWS N K``, ``--no-gemm``
to skip): ``kernforge.ops.m_grouped_fp8_fp4_gemm_nt_contiguous`` on e4m3 activations (1x128
scales) and packed e2m1 expert weights (1x32 scales) against torch's dequantise + per-expert
matmul on the same bytes: ``kernforge.model.quant.unpack_fp4`` times the scales, the
activations' scales applied, then one ``a[rows] @ w[e].T`` per expert, in float32 (torch's
fast CPU GEMM on AVX2) and in bf16 (the model's dtype); the ratio is against the faster of the two.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from typing import Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kernforge.ops as kops  # noqa: E402
from kernforge.kernels import gemm as DG  # noqa: E402
from kernforge.kernels import grouped_gemm as G  # noqa: E402
from kernforge.model.quant import unpack_fp4  # noqa: E402
from kernforge.ops import moe  # noqa: E402

CLOCK = time.perf_counter


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} CPUs"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"


SCALE = 1.5


def torch_route(logits: torch.Tensor, bias: torch.Tensor, k: int):
    """Gate.forward's ops after the logits (sqrtsoftplus, norm_topk_prob)."""
    scores = torch.sqrt(torch.nn.functional.softplus(logits))
    idx = torch.topk(scores + bias, k, dim=-1).indices
    weights = scores.gather(1, idx)
    return idx, weights / weights.sum(-1, keepdim=True) * SCALE


def kernforge_route(logits: torch.Tensor, bias: torch.Tensor, k: int, backend: str):
    return kops.top2_sum_gate(logits, bias, k, 0, 0, False, 0, SCALE, 0, 1, 0, 1, "sqrtsoftplus", backend=backend)


def torch_path(x: torch.Tensor, logits: torch.Tensor, bias: torch.Tensor, k: int) -> torch.Tensor:
    """The model's dispatch/combine with identity experts (MoE.forward's loop)."""
    indices, weights = torch_route(logits, bias, k)
    y = torch.zeros_like(x)
    for e in torch.unique(indices).tolist():
        hit = indices == e
        rows = hit.any(dim=1).nonzero().squeeze(1)
        slot = hit[rows].to(torch.int8).argmax(dim=1)
        y.index_add_(0, rows, x.index_select(0, rows) * weights[rows, slot, None].to(x.dtype))
    return y


def expanded_buffer(x: torch.Tensor, k: int, experts: int, alignment: int) -> torch.Tensor:
    """The caller-held expanded buffer: the mapping's worst case for ``x``'s token count."""
    rows = (x.shape[0] * k + (alignment - 1) * experts) // alignment * alignment
    return torch.empty(rows, x.shape[1], dtype=x.dtype)


def kernforge_path(x: torch.Tensor, logits: torch.Tensor, bias: torch.Tensor, k: int, experts: int, alignment: int,
                   backend: str, torch_routing: bool, buffer: Optional[torch.Tensor] = None) -> torch.Tensor:
    indices, weights = (torch_route(logits, bias, k) if torch_routing
                        else kernforge_route(logits, bias, k, backend))
    p2e, _, _, t2p, *_ = moe.get_fused_mapping(indices, experts, 0, alignment, backend=backend)
    expanded = moe.expand_to_fused(x, t2p, p2e, out=buffer, backend=backend)
    return moe.reduce_fused(expanded, weights, t2p, backend=backend)


def stage_times(x, logits, bias, k: int, experts: int, alignment: int, backend: str, buffer, repeat: int) -> list:
    """Median time of each kernforge op in the path (route, mapping, expand, reduce), each
    repeat followed by one run of the torch path, as in the interleaved timing."""
    times: list[list[float]] = [[], [], [], []]
    for _ in range(repeat + 1):
        t0 = CLOCK()
        indices, weights = kernforge_route(logits, bias, k, backend)
        t1 = CLOCK()
        p2e, _, _, t2p, *_ = moe.get_fused_mapping(indices, experts, 0, alignment, backend=backend)
        t2 = CLOCK()
        expanded = moe.expand_to_fused(x, t2p, p2e, out=buffer, backend=backend)
        t3 = CLOCK()
        moe.reduce_fused(expanded, weights, t2p, backend=backend)
        t4 = CLOCK()
        for ts, v in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            ts.append(v)
        torch_path(x, logits, bias, k)
    return [statistics.median(ts[1:]) for ts in times]


def torch_fp4_grouped(a8, sfa, b4, sfb, m_indices, dtype: torch.dtype) -> torch.Tensor:
    """Dequantise both sides, then one matmul per expert over its rows (``-1`` rows stay zero)."""
    m, k = a8.shape
    a = (a8.float() * sfa.repeat_interleave(128, 1)[:, :k]).to(dtype)
    groups, n, _ = b4.shape
    w = (unpack_fp4(b4.view(groups * n, -1)) * sfb.view(groups * n, -1).repeat_interleave(32, 1)).to(dtype)
    w = w.view(groups, n, k)
    d = torch.zeros(m, n, dtype=torch.bfloat16)
    for e in range(groups):
        rows = (m_indices == e).nonzero().squeeze(1)
        if rows.numel():
            d[rows] = (a[rows] @ w[e].T).bfloat16()
    return d


def gemm_rows(groups: int, rows: int, n: int, k: int, repeat: int, backend: str) -> list[tuple]:
    """The FP8 x FP4 grouped GEMM against torch's dequantise + per-expert matmul: experts of
    ``rows`` +- 25% rows (routing-like: the layout pads each to the alignment, and the kernel
    computes whole row tiles), then experts of exactly ``rows`` rows (no padding)."""
    g = torch.Generator().manual_seed(0)
    jittered = [max(1, rows + int(r)) for r in torch.randint(-rows // 4, rows // 4 + 1, (groups,), generator=g)]
    return [gemm_row(group_rows, n, k, repeat, backend, g) for group_rows in (jittered, [rows] * groups)]


def gemm_row(group_rows: list[int], n: int, k: int, repeat: int, backend: str, g: torch.Generator) -> tuple:
    groups = len(group_rows)
    alignment = kops.get_mk_alignment_for_contiguous_layout()
    m_indices = G.contiguous_layout(group_rows, alignment)
    a8, sfa = DG.per_token_cast_to_fp8(torch.randn(m_indices.numel(), k, generator=g))
    b4, sfb = DG.per_token_cast_to_fp4(torch.randn(groups, n, k, generator=g))
    d = torch.empty(m_indices.numel(), n, dtype=torch.bfloat16)
    ours = lambda: kops.m_grouped_fp8_fp4_gemm_nt_contiguous((a8, sfa), (b4, sfb), d, m_indices,  # noqa: E731
                                                             backend=backend)
    f32 = lambda: torch_fp4_grouped(a8, sfa, b4, sfb, m_indices, torch.float32)  # noqa: E731
    bf16 = lambda: torch_fp4_grouped(a8, sfa, b4, sfb, m_indices, torch.bfloat16)  # noqa: E731
    ours()
    assert DG.calc_diff(d, f32()) < 0.01, "kernforge and torch disagree (DeepGEMM's FP4 calc_diff bound)"
    kf, t32, t16 = median_times([ours, f32, bf16], repeat)
    flops = 2 * sum(group_rows) * n * k
    label = f"G {groups}, {sum(group_rows)} rows ({m_indices.numel()} padded), N {n}, K {k}"
    return (label, f"{kf * 1e3:.1f}", f"{t32 * 1e3:.1f}", f"{t16 * 1e3:.1f}", f"{min(t32, t16) / kf:.2f}x",
            f"{flops / kf / 1e9:.1f}")


def print_table(header, rows, markdown: bool) -> None:
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        print("  ".join(h.rjust(w) for h, w in zip(header, widths)))
        for r in rows:
            print("  ".join(c.rjust(w) for c, w in zip(r, widths)))


def median_times(fns, repeat: int) -> list[float]:
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeat):
        for fn, ts in zip(fns, times):
            t = CLOCK()
            fn()
            ts.append(CLOCK() - t)
    return [statistics.median(ts) for ts in times]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 4096])
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--topk", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--alignment", type=int, default=128)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--repeat", type=int, default=11)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--torch-routing", action="store_true", help="torch.topk routing in both columns")
    ap.add_argument("--clock", choices=("wall", "process"), default="wall",
                    help="wall time, or this process's CPU time (steadier on a loaded machine; one thread per side)")
    ap.add_argument("--fresh-buffer", action="store_true",
                    help="allocate the expanded buffer on every call instead of reusing a caller-held one")
    ap.add_argument("--gemm-shape", type=int, nargs=4, default=[8, 128, 512, 2048], metavar=("G", "ROWS", "N", "K"),
                    help="FP8 x FP4 grouped GEMM: experts, mean rows per expert, N, K")
    ap.add_argument("--no-gemm", action="store_true", help="skip the FP8 x FP4 grouped GEMM rows")
    ap.add_argument("--stages", action="store_true",
                    help="also time each kernforge op of the path (route, mapping, expand, reduce)")
    args = ap.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "process" else time.perf_counter

    print(f"# CPU: {cpu_model()}; torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"# E={args.experts} k={args.topk} hidden={args.hidden} bf16, alignment {args.alignment}, "
          f"backend {args.backend}, median of {args.repeat} interleaved runs ({args.clock} time); routing: "
          f"{'torch in both columns' if args.torch_routing else 'kernforge top2_sum_gate vs the model Gate ops'}; "
          f"expanded buffer: {'fresh per call' if args.fresh_buffer else 'caller-held, reused'}")
    header = ("T", "kernforge ms", "torch (model path) ms", "torch / kernforge")
    rows, stages = [], []
    for t in args.tokens:
        g = torch.Generator().manual_seed(t)
        x = torch.randn(t, args.hidden, generator=g).bfloat16()
        logits = torch.randn(t, args.experts, generator=g)
        bias = torch.randn(args.experts, generator=g) * 0.1
        buffer = None if args.fresh_buffer else expanded_buffer(x, args.topk, args.experts, args.alignment)
        ours = lambda: kernforge_path(x, logits, bias, args.topk, args.experts, args.alignment,  # noqa: E731
                                      args.backend, args.torch_routing, buffer)
        theirs = lambda: torch_path(x, logits, bias, args.topk)  # noqa: E731
        # the same answer: torch rounds each index_add_ to bf16, kernforge the float32 sum once
        torch.testing.assert_close(ours().float(), theirs().float(), rtol=2 ** -5, atol=2 ** -5)
        kf, tt = median_times([ours, theirs], args.repeat)
        rows.append((str(t), f"{kf * 1e3:.3f}", f"{tt * 1e3:.3f}", f"{tt / kf:.2f}x"))
        if args.stages:
            stages.append((str(t),) + tuple(f"{v * 1e3:.3f}" for v in stage_times(
                x, logits, bias, args.topk, args.experts, args.alignment, args.backend, buffer, args.repeat)))
    print_table(header, rows, args.markdown)
    if args.stages:
        print(f"\n# kernforge ops, ms (median of {args.repeat}, each followed by the torch path)")
        print_table(("T", "top2_sum_gate", "get_fused_mapping", "expand_to_fused", "reduce_fused"), stages,
                    args.markdown)
    if not args.no_gemm:
        print(f"\n# FP8 x FP4 grouped GEMM (contiguous, alignment {kops.get_mk_alignment_for_contiguous_layout()}), "
              f"backend {args.backend}; load average {os.getloadavg()[0]:.1f}")
        print_table(("shape", "kernforge ms", "torch f32 ms", "torch bf16 ms", "best torch / kernforge",
                     "kernforge GFLOP/s"), gemm_rows(*args.gemm_shape, args.repeat, args.backend), args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
