"""The AOT kernel pack: every kernel the engine launches for a config, compiled ahead of time
into a cache directory that deployments mount as the runtime's read-only shared tier.

Why: the engine compiles each kernel on its first call (seconds each on a CPU, minutes for
a V4-Flash CUDA build), so a fresh serving process would stall on its first requests.
`build` compiles the whole set once, in parallel, into `PACK/`; a deployment then sets
``KERNFORGE_CACHE_DIR=<private writable dir>:PACK`` (the runtime searches every root in
order and writes only into the first, docs/runtime.md "Tiers"), and its first forward
finds every kernel there: no compile at all (tests/engine/test_pack.py).

The list is derived, not written by hand: `engine_kernels` walks the engine's forward
(embedding, each block's attention, compressors, indexer and MoE, the head, the MTP
block) and asks each op's own configuration chooser (the `choose*` functions the ops
call, tuning database included) for the parameters it will compile at the config's
shapes. The row count of a call (`m`) only matters to the GEMM choosers, so they are
asked at every step size from 1 to 512 and at every power of two up to the largest step
(`max_batch_size * max_seq_len` tokens): the choosers cut at 16 and 64 rows. `record`
runs a real tiny forward in a fresh process and lists what it compiled; the tests check
that both agree, so a new engine step or a changed op shows up as a difference.

Scope: the engine's default cache (bf16 KV pages, not `is_fp8_kvcache`), one activation
dtype per pack, and the CUDA TMA build of each kernel (the cp.async fallback that a launch
compiles when a tensor breaks TMA's alignment rules is not in the pack). A CPU pack is
keyed by the compiler and the CPU it was built on (`-march=native`), so build it on the
machine kind that serves.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import multiprocessing
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Callable, Iterable, Optional

CONFIGS = ("tiny", "v4-flash")
BACKENDS = ("cpu", "cuda")
DTYPES = ("float32", "bfloat16")
MOE_ALIGNMENT = 64  # kernel_steps.MOE_ALIGNMENT (imported lazily: it pulls in torch and the ops)

# factory name (what `kernforge.compile` is given) -> (module, attribute)
FACTORIES = {
    "rms_norm": ("kernforge.kernels.norm", "rms_norm"),
    "rotary_embedding": ("kernforge.kernels.rope", "rotary_embedding"),
    "hadamard": ("kernforge.kernels.hadamard", "hadamard"),
    "hc_pre": ("kernforge.kernels.hyper_connection", "hc_pre"),
    "hc_post": ("kernforge.kernels.hyper_connection", "hc_post"),
    "hc_head": ("kernforge.kernels.hyper_connection", "hc_head"),
    "embedding": ("kernforge.kernels.embedding", "embedding"),
    "dense_gemm": ("kernforge.kernels.gemm", "dense_gemm"),
    "hash_gate": ("kernforge.kernels.routing", "hash_gate"),
    "top2_sum_gate": ("kernforge.kernels.routing", "top2_sum_gate"),
    "moe_mapping_scan": ("kernforge.kernels.moe_permute.kernel", "moe_mapping_scan"),
    "moe_mapping_scatter": ("kernforge.kernels.moe_permute.kernel", "moe_mapping_scatter"),
    "expand_to_fused": ("kernforge.kernels.moe_permute.kernel", "expand_to_fused"),
    "reduce_fused": ("kernforge.kernels.moe_permute.kernel", "reduce_fused"),
    "swiglu": ("kernforge.kernels.swiglu.kernel", "swiglu"),
    "mla_decode_sparse": ("kernforge.kernels.mla_decode", "mla_decode_sparse"),
    "topk_select": ("kernforge.kernels.topk", "topk_select"),
    "fake_quant_e4m3": ("kernforge.kernels.quant", "fake_quant_e4m3"),
    "fake_quant_e2m1": ("kernforge.kernels.quant", "fake_quant_e2m1"),
    "compressor_pool": ("kernforge.kernels.compressor", "compressor_pool"),
    "indexer_scores": ("kernforge.kernels.indexer", "indexer_scores"),
}


class PackError(ValueError):
    """A bad request for a pack (unknown config, backend, arch or dtype), or kernels that failed to build."""


@dataclasses.dataclass(frozen=True, order=True)
class KernelSpec:
    """One compiled kernel: factory name, backend and the whole parameter set (one shape bucket)."""

    kernel: str
    backend: str
    params: tuple  # sorted (name, value) pairs

    @property
    def kwargs(self) -> dict:
        return dict(self.params)

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "backend": self.backend, "params": self.kwargs}


# ---------------------------------------------------------------- validation


def model_config(name: str, **overrides):
    """The `kernforge.model` config a pack names ("tiny" or "v4-flash")."""
    from kernforge.model import tiny, v4_flash

    if name not in CONFIGS:
        raise PackError(f"config must be one of {', '.join(CONFIGS)}, got {name!r}")
    return (tiny if name == "tiny" else v4_flash)(**overrides)


def check_target(backend: str, arch: Optional[str], dtype: str = "float32") -> Optional[str]:
    """The arch a pack builds for (None on the CPU; default sm_90a on CUDA), or a PackError."""
    if backend not in BACKENDS:
        raise PackError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if dtype not in DTYPES:
        raise PackError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if backend == "cpu":
        if arch is not None:
            raise PackError(f"--arch applies to --backend cuda (the CPU pack is built for this machine's CPU), "
                            f"got {arch!r}")
        return None
    from kernforge.backends.cuda.arch import ARCHS, DEFAULT_ARCH

    arch = arch or DEFAULT_ARCH
    if arch not in ARCHS:
        raise PackError(f"arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    return arch


# ---------------------------------------------------------------- the static enumeration


def step_sizes(config) -> list[int]:
    """The step sizes (tokens per `step`) at which the GEMM choosers are asked: 1..512 and the
    powers of two up to the largest step, `max_batch_size * max_seq_len`."""
    top = config.max_batch_size * config.max_seq_len
    sizes = set(range(1, min(512, top) + 1)) | {top}
    p = 1024
    while p < top:
        sizes.add(p)
        p *= 2
    return sorted(sizes)


class _Plan:
    """Collects the kernels of one enumeration, each with the engine steps that launch it."""

    def __init__(self, backend: str, dtype: str):
        self.backend, self.dt = backend, dtype
        self.specs: dict[KernelSpec, set[str]] = {}

    def add(self, step: str, kernel: str, params: dict) -> None:
        spec = KernelSpec(kernel, self.backend, tuple(sorted(params.items())))
        self.specs.setdefault(spec, set()).add(step)

    # one method per op, asking its chooser exactly as the op does
    def rms(self, step: str, dim: int, weighted: bool = True) -> None:
        from kernforge.kernels import norm

        self.add(step, "rms_norm", norm.choose(self.backend, dim, self.dt, self.dt if weighted else None, self.dt))

    def rope(self, step: str, head_dim: int, rope_dim: int, inverse: bool = False) -> None:
        from kernforge.kernels import rope

        self.add(step, "rotary_embedding", rope.choose(self.backend, head_dim, rope_dim, self.dt, "int64", inverse))

    def hadamard(self, step: str, n: int) -> None:
        from kernforge.kernels import hadamard

        self.add(step, "hadamard", hadamard.choose(self.backend, n, self.dt))

    def gemm(self, step: str, n: int, k: int, rows: Iterable[int], accumulate: bool = False) -> None:
        from kernforge.kernels.gemm import config

        for m in rows:
            # kernel_steps.gemm: ops.*_gemm_nn on x [M, K] and a contiguous [K, N] weight (MN-major B)
            self.add(step, "dense_gemm", config.choose_dense(self.backend, n, k, m, a_major="k", b_major="mn",
                                                             accumulate=accumulate, dtype=self.dt, out_dtype=self.dt))

    def fp8_round(self, step: str) -> None:
        from kernforge.kernels import quant

        self.add(step, "fake_quant_e4m3", quant.config.choose_fake_fp8(self.backend, self.dt, quant.FAKE_FP8_BLOCK))

    def fp4_round(self, step: str) -> None:
        from kernforge.kernels import quant

        self.add(step, "fake_quant_e2m1", quant.config.choose_fake_fp4(self.backend, quant.FP4_BLOCK))


def engine_kernels(config, backend: str, dtype: str = "float32",
                   tokens: Optional[Iterable[int]] = None) -> dict[KernelSpec, set[str]]:
    """{kernel: the engine steps that launch it} for an `Engine` of `config` on `backend` with
    activations (the model's weights) in `dtype`, for steps of `tokens` tokens each (default:
    every bucket, `step_sizes(config)`).

    The walk follows `Engine._advance` / `_block` / `_attention` / `_moe` / `_head` and
    `mtp_logits` call for call; each op's parameters come from the chooser the op itself calls."""
    c = config
    sizes = sorted(set(tokens)) if tokens is not None else step_sizes(c)
    # an expert's segment holds 1..N of a step's N tokens (each token once per expert)
    expert_rows = sorted({m for m in (range(1, max(sizes) + 1) if tokens is not None else sizes)})
    plan = _Plan(backend, dtype)
    b, dt = backend, dtype
    d, rd, h, big_d = c.head_dim, c.qk_rope_head_dim, c.num_attention_heads, c.hidden_size
    from kernforge.kernels import compressor, embedding, hyper_connection as hc, indexer, mla_decode, routing, topk
    from kernforge.kernels.moe_permute import config as permute
    from kernforge.kernels.swiglu import config as swiglu

    plan.add("embedding", "embedding", embedding.choose(b, big_d, dt, "int64"))

    def attention(layer_id: int, ratio: int) -> None:
        plan.rms("rms_norm", big_d)  # attn_norm
        # kernel_steps.attention_input: wq_a, wkv, the compressors' kv and gate (their ape is added
        # by compressor_pool) and the indexer's head weights, side by side in one GEMM
        width = (2 if ratio == 4 else 1) * d
        ih, ihd = c.index_n_heads, c.index_head_dim
        n_in = c.q_lora_rank + d + (2 * width if ratio else 0) + (4 * ihd + ih if ratio == 4 else 0)
        plan.gemm("attention_input", n_in, big_d, sizes)
        plan.rms("rms_norm", c.q_lora_rank)  # q_norm
        plan.gemm("linear", h * d, c.q_lora_rank, sizes)  # wq_b
        plan.rms("rms_norm", d, weighted=False)  # per-head q renorm
        plan.rope("rope", d, rd)  # q and kv
        plan.rms("rms_norm", d)  # kv_norm
        if c.fake_quant:
            plan.fp8_round("kv_fake_quant")
        extra = 0
        if ratio:
            pool(d, ratio)
            if c.fake_quant:
                plan.fp8_round("compressor_pool")
            extra = c.max_seq_len // ratio
        if ratio == 4:  # the indexer: its compressor, head weights, query, scores and top-k
            pool(ihd, 4)
            plan.hadamard("compressor_pool", ihd)
            plan.gemm("linear", ih * ihd, c.q_lora_rank, sizes)  # indexer wq_b
            plan.rope("rope", ihd, rd)
            plan.hadamard("hadamard", ihd)
            if c.fake_quant:
                plan.fp4_round("indexer_fp4_round")
                plan.fp4_round("compressor_pool")
            for rows in (1, 8, 32):  # the query-count tiles (indexer.config.row_block)
                plan.add("indexer_scores", "indexer_scores", indexer.choose(b, ih, ihd, dt, rows))
            # rows of up to max_seq_len // 4 scores: the short-row configuration, and the long one past it
            for row in {topk.config.row_bucket(1), topk.config.row_bucket(c.max_seq_len // 4)}:
                plan.add("indexer_topk", "topk_select", topk.config.choose(b, c.index_topk, "float32", "int64",
                                                                            False, False, row=row))
            extra = c.index_topk
        plan.add("sparse_mla", "mla_decode_sparse",
                 mla_decode.config.choose_sparse(b, h, c.sliding_window + extra, 1, d, d, False))
        plan.rope("rope", d, rd, inverse=True)
        per_group = h * d // c.o_groups
        plan.gemm("grouped_output", c.o_lora_rank, per_group, sizes)
        plan.gemm("linear", big_d, c.o_groups * c.o_lora_rank, sizes)  # wo_b

    def pool(dim: int, ratio: int) -> None:
        """`kernel_steps.compressor_pool`: the pooling, then RMSNorm and RoPE of the new entries."""
        plan.add("compressor_pool", "compressor_pool", compressor.choose(b, dim, ratio, ratio == 4, dt))
        plan.rms("compressor_pool", dim)
        plan.rope("compressor_pool", dim, rd)

    def moe(layer_id: int) -> None:
        e, k, inter = c.n_routed_experts, c.num_experts_per_tok, c.moe_intermediate_size
        plan.gemm("router_logits", e, big_d, sizes)
        if c.is_hash_layer(layer_id):
            plan.add("routing", "hash_gate", routing.config.choose_hash(b, e, k, c.scoring_func, c.norm_topk_prob))
        else:
            plan.add("routing", "top2_sum_gate", routing.config.choose_top2_sum(
                b, num_experts=e, num_topk=k, num_groups=0, num_topk_groups=0, scoring_func=c.scoring_func,
                num_shared=0, has_mask=False, has_fix=False, has_unmapped=False, has_map=False))
        mapping = permute.choose_mapping(b, k, e, MOE_ALIGNMENT)
        plan.add("moe_mapping", "moe_mapping_scan", mapping)
        plan.add("moe_mapping", "moe_mapping_scatter",
                 permute.choose_scatter(b, k, e, MOE_ALIGNMENT, mapping["chunk"]))
        plan.add("moe_expand", "expand_to_fused", permute.choose_expand(b, big_d, k, dt))
        plan.gemm("expert_gemm", 2 * inter, big_d, expert_rows)
        plan.gemm("expert_gemm", big_d, inter, expert_rows)
        plan.add("swiglu", "swiglu", swiglu.choose(b, inter, dt, True, False))
        plan.gemm("linear", 2 * inter, big_d, sizes)  # shared expert [w1; w3]
        plan.add("swiglu", "swiglu", swiglu.choose(b, inter, dt, False, False))
        plan.gemm("linear", big_d, inter, sizes)  # shared w2
        plan.add("moe_reduce", "reduce_fused", permute.choose_reduce(b, big_d, k + 1, dt, dt, False, False, False))

    def block(layer_id: int, ratio: int) -> None:
        plan.add("hc_pre", "hc_pre", hc.choose_pre(b, c.hc_mult, big_d, c.hc_sinkhorn_iters, dt, dt))
        attention(layer_id, ratio)
        plan.add("hc_post", "hc_post", hc.choose_post(b, c.hc_mult, big_d, dt))
        plan.rms("rms_norm", big_d)  # ffn_norm
        moe(layer_id)

    def head() -> None:
        plan.add("hc_head", "hc_head", hc.choose_head(b, c.hc_mult, big_d, dt, dt))
        plan.rms("rms_norm", big_d)
        plan.gemm("linear", c.vocab_size, big_d, sizes)

    n = c.num_hidden_layers
    for layer_id in range(n):
        block(layer_id, c.compress_ratios[layer_id])
    head()
    for j in range(c.num_nextn_predict_layers):  # mtp_logits: e_proj(enorm(embed)) + h_proj(hnorm(streams))
        plan.rms("rms_norm", big_d)
        plan.gemm("linear", big_d, big_d, sizes)
        plan.gemm("linear", big_d, big_d, [m * c.hc_mult for m in sizes], accumulate=True)
        block(n + j, c.compress_ratios[n + j])
        head()
    return plan.specs


def list_kernels(config_name: str, backend: str, arch: Optional[str] = None, dtype: str = "float32"
                 ) -> list[tuple[KernelSpec, list[str]]]:
    """The pack's rows, sorted: (kernel, the engine steps that launch it)."""
    check_target(backend, arch, dtype)
    found = engine_kernels(model_config(config_name), backend, dtype)
    return [(spec, sorted(found[spec])) for spec in sorted(found, key=_order)]


def _order(spec: KernelSpec):
    return spec.kernel, repr(spec.params)


# ---------------------------------------------------------------- what a forward really compiles


def record(config_name: str = "tiny", backend: str = "cpu", dtype: str = "float32", prefill: int = 140,
           seed: int = 0) -> set[KernelSpec]:
    """The kernels a real forward requests, in a fresh process (so no op's memo hides one): a
    prefill of `prefill` tokens and one decode step through `Engine.forward`, then the same
    through `forward_hidden` + `mtp_logits`. Compare with `engine_kernels(config, backend,
    dtype, tokens=(prefill, 1))`."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        rows = pool.submit(_record_worker, config_name, backend, dtype, prefill, seed).result()
    return {KernelSpec(k, b, tuple(p)) for k, b, p in rows}


def _record_worker(config_name: str, backend: str, dtype: str, prefill: int, seed: int) -> list:
    import torch

    import kernforge
    from kernforge.jit import kernel as jit

    seen = []

    def recording_compile(func, backend="interp", out_idx=None, arch=None, target=None, checks=None, **params):
        seen.append((getattr(func, "name", getattr(func, "__name__", repr(func))), target or backend,
                     tuple(sorted(params.items()))))
        return jit.compile(func, backend, out_idx, arch, target, checks, **params)

    kernforge.compile = recording_compile  # every op calls kernforge.compile on its first use of a kernel
    from kernforge.engine import Engine
    from kernforge.model import random_model

    model = random_model(model_config(config_name), seed, dtype=getattr(torch, dtype))
    eng = Engine(model, backend=backend)
    ids = torch.randint(0, model.config.vocab_size, (1, prefill + 2), generator=torch.Generator().manual_seed(seed))
    eng.forward(ids[:, :prefill], 0)
    eng.forward(ids[:, prefill:prefill + 1], prefill)
    if model.mtp:
        h = eng.forward_hidden(ids[:, :prefill], 0)
        eng.mtp_logits(h, ids[:, 1:prefill + 1], 0)
        h = eng.forward_hidden(ids[:, prefill:prefill + 1], prefill)
        eng.mtp_logits(h, ids[:, prefill + 1:prefill + 2], prefill)
    return seen


# ---------------------------------------------------------------- building


@dataclasses.dataclass
class PackResult:
    path: str
    kernels: int
    compiles: int
    seconds: float
    bytes: int

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def build(config_name: str, backend: str, out: str, arch: Optional[str] = None, jobs: Optional[int] = None,
          dtype: str = "float32", progress: Optional[Callable[[int, int, KernelSpec], None]] = None) -> PackResult:
    """Compile every kernel of `list_kernels` into the cache directory `out` (created; an
    existing pack there is completed, not rebuilt) in `jobs` spawned processes (default: the
    CPU count), and write `out/pack.json` describing it. CUDA builds compile without loading
    (no GPU needed). `progress(done, total, spec)` is called after each kernel."""
    arch = check_target(backend, arch, dtype)
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise PackError(f"jobs must be a positive int, got {jobs!r}")
    rows = list_kernels(config_name, backend, arch, dtype)
    out = os.path.abspath(out)
    os.makedirs(out, exist_ok=True)
    t0 = time.perf_counter()
    compiles, failed = 0, []
    ctx = multiprocessing.get_context("spawn")  # torch and OpenMP threads do not survive a fork
    workers = max(1, min(jobs or os.cpu_count() or 1, len(rows)))
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_worker_init,
                             initargs=(out,)) as pool:
        futures = {pool.submit(_build_one, spec.kernel, backend, spec.params, arch): spec for spec, _ in rows}
        for done, fut in enumerate(as_completed(futures), 1):
            spec = futures[fut]
            try:
                compiles += fut.result()
            except Exception as e:  # noqa: BLE001 - reported together below, with the kernel named
                failed.append(f"{spec.kernel} {spec.kwargs}: {type(e).__name__}: {e}")
            if progress is not None:
                progress(done, len(rows), spec)
    if failed:
        raise PackError(f"{len(failed)} of {len(rows)} kernels failed to build: " + "; ".join(failed[:5]))
    seconds = time.perf_counter() - t0
    size = _tree_bytes(os.path.join(out, "cache"))
    import kernforge

    manifest = {"config": config_name, "backend": backend, "arch": arch, "dtype": dtype,
                "kernforge_version": kernforge.__version__, "kernels": [s.to_json() for s, _ in rows],
                "build_seconds": seconds, "compiles": compiles, "bytes": size, "created": time.time()}
    with open(os.path.join(out, "pack.json"), "w") as f:
        json.dump(manifest, f, indent=1, default=str)
    for leftover in ("tmp", "locks"):  # build scratch: a read-only tier needs neither
        shutil.rmtree(os.path.join(out, leftover), ignore_errors=True)
    return PackResult(out, len(rows), compiles, seconds, size)


def _worker_init(cache_dir: str) -> None:
    os.environ["KERNFORGE_CACHE_DIR"] = cache_dir  # before the runtime reads its configuration


def _build_one(kernel: str, backend: str, params: tuple, arch: Optional[str]) -> int:
    """Build one kernel as the op would (CPU: `kernforge.compile`, which loads it; CUDA: the
    backend's compile-only report); returns how many compiles it took (0: already packed)."""
    from kernforge import backends, runtime

    module, attr = FACTORIES[kernel]
    factory = getattr(importlib.import_module(module), attr)
    before = runtime.stats()["compiles"]
    if backend == "cpu":
        import kernforge

        kernforge.compile(factory, backend="cpu", **dict(params))
    else:
        backends.get("cuda").build_report(factory(**dict(params)).ir, arch)
    return runtime.stats()["compiles"] - before


def _tree_bytes(root: str) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        total += sum(os.path.getsize(os.path.join(folder, f)) for f in files)
    return total


def deployment_env(pack: str, private: str) -> str:
    """The `KERNFORGE_CACHE_DIR` value that serves from `pack`: a writable private root first
    (misses are built there), the pack behind it as the read-only shared tier."""
    return f"{os.path.abspath(private)}{os.pathsep}{os.path.abspath(pack)}"
