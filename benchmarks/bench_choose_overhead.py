"""What consulting the tuning database costs an op call: every family's chooser, wrapped in
:func:`kernforge.tune.consult.tuned`, against its own heuristic (``chooser.heuristic``,
the peer), timed interleaved.  Two database states: no file at all, and one where every
call's lookup has a tuned row (the memo then returns the tuned configuration).  Last, the
``topk op cache`` row: ``kernforge.ops.topk``'s kernel-cache hit keyed with
``consult.stamp()`` ("tuned") against one keyed on the call signature alone ("heuristic").

    python benchmarks/bench_choose_overhead.py [--rounds 15] [--calls 2000] [--json]

Prints per chooser the median microseconds per call of both and the difference (the
machine is shared, so read the difference and the ratio, not the absolute numbers)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

B = "cpu"


def calls():
    """(label, chooser, args, kwargs): one production-sized call per chooser."""
    from kernforge.kernels.embedding import config as emb
    from kernforge.kernels.gemm import config as gemm
    from kernforge.kernels.grouped_gemm import config as gg
    from kernforge.kernels.hadamard import config as had
    from kernforge.kernels.hyper_connection import config as hc
    from kernforge.kernels.mla_decode import config as mla
    from kernforge.kernels.moe_permute import config as mp
    from kernforge.kernels.norm import config as norm
    from kernforge.kernels.quant import config as quant
    from kernforge.kernels.rope import config as rope
    from kernforge.kernels.routing import config as routing
    from kernforge.kernels.swiglu import config as swiglu
    from kernforge.kernels.topk import config as topk

    majors = dict(a_major="k", b_major="k", gran_n=128)
    return [
        ("embedding", emb.choose, (4096, "bfloat16", "int64"), {}),
        ("fp8_gemm", gemm.choose, (7168, 2048, 4096), dict(accumulate=False, out_dtype="bfloat16", **majors)),
        ("dense_gemm", gemm.choose_dense, (7168, 2048, 4096), dict(a_major="k", b_major="k", accumulate=False,
                                                                   dtype="bfloat16", out_dtype="bfloat16")),
        ("grouped_gemm", gg.choose, (4, 4096, 2048), dict(alignment=128)),
        ("grouped_fp8", gg.choose_fp8, (4, 4096, 2048), dict(alignment=128)),
        ("grouped_masked", gg.choose_masked, (32, 4096, 2048, 192), {}),
        ("hadamard", had.choose, (128, "bfloat16"), {}),
        ("hc_pre", hc.choose_pre, (4, 4096, 20, "bfloat16", "float32"), {}),
        ("mla_decode", mla.choose, (128, 1, 1, 576, 512, 64, False), {}),
        ("mla_sparse", mla.choose_sparse, (128, 2048, 2, 576, 512, False), {}),
        ("mla_combine", mla.choose_combine, (128, 16), {}),
        ("moe_mapping", mp.choose_mapping, (6, 256, 128), {}),
        ("moe_scatter", mp.choose_scatter, (6, 256, 128, 256), {}),
        ("moe_reduce", mp.choose_reduce, (4096, 6, "bfloat16", "bfloat16", True, False, False), {}),
        ("rms_norm", norm.choose, (4096, "bfloat16", "float32", "bfloat16"), {}),
        ("quant_token", quant.choose_token, ("bfloat16", False), {}),
        ("rope", rope.choose, (512, 64, "bfloat16", "int64", False), {}),
        ("topk_gate", routing.choose_topk, (256, 8), {}),
        ("swiglu", swiglu.choose, (2048, "bfloat16", True, True), {}),
        ("topk", topk.choose, (512, "float32", "int64", True, True), {}),
    ]


def _per_call_us(fn, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def measure(rounds: int, n: int) -> list[dict]:
    rows = []
    for label, chooser, args, kwargs in calls():
        tuned = lambda: chooser(B, *args, **kwargs)  # noqa: E731
        plain = lambda: chooser.heuristic(B, *args, **kwargs)  # noqa: E731
        tuned(), plain()
        a, b = [], []
        for _ in range(rounds):  # interleaved: both see the same machine load
            a.append(_per_call_us(tuned, n))
            b.append(_per_call_us(plain, n))
        ta, tb = statistics.median(a), statistics.median(b)
        rows.append(dict(chooser=label, tuned_us=round(ta, 3), heuristic_us=round(tb, 3),
                         added_us=round(ta - tb, 3), ratio=round(ta / tb, 2)))
    return rows


def measure_stamp(rounds: int, n: int) -> dict:
    """``kernforge.ops.topk``'s kernel cache hit with its key's
    :func:`~kernforge.tune.consult.stamp` (what lets it see a later sweep) against the same
    cache keyed on the call signature alone (its key before)."""
    import functools

    from kernforge.tune import consult

    with_stamp = functools.lru_cache(maxsize=None)(lambda *key: None)
    without = functools.lru_cache(maxsize=None)(lambda *key: None)
    sig = (B, 16, "float32", "int64", True, True)
    a, b = [], []
    for _ in range(rounds):
        a.append(_per_call_us(lambda: with_stamp(*sig, consult.stamp()), n))
        b.append(_per_call_us(lambda: without(*sig), n))
    ta, tb = statistics.median(a), statistics.median(b)
    return dict(chooser="topk op key", tuned_us=round(ta, 3), heuristic_us=round(tb, 3), added_us=round(ta - tb, 3),
                ratio=round(ta / tb, 2))


def record_all() -> None:
    """A tuned row for every call above (one tunable of the heuristic's, recorded as is)."""
    from kernforge.kernels import registry
    from kernforge.tune import Database, Row, consult, sweep

    names = dict(embedding="embedding", fp8_gemm="fp8_gemm_nt", dense_gemm="bf16_gemm_nt",
                 grouped_gemm="m_grouped_gemm_nt_contiguous", grouped_fp8="m_grouped_fp8_gemm_nt_contiguous",
                 grouped_masked="m_grouped_gemm_nt_masked", hadamard="hadamard", hc_pre="hc_pre",
                 mla_decode="mla_decode", mla_sparse="mla_decode_sparse", mla_combine="mla_decode_combine",
                 moe_mapping="moe_mapping_scan", moe_scatter="moe_mapping_scatter",
                 moe_reduce="reduce_fused", rms_norm="rms_norm", quant_token="per_token_cast_to_fp8",
                 rope="rotary_embedding", topk_gate="topk_gate", swiglu="swiglu", topk="topk_fp32")
    with Database() as db:
        for label, chooser, args, kwargs in calls():
            name = names[label]
            factory = registry.get(name).factory
            factory = getattr(factory, "factory", factory)
            heuristic = chooser.heuristic(B, *args, **kwargs)
            config = {t: heuristic.get(t, factory.signature.parameters[t].default) for t in factory.space}
            params = dict({k: v for k, v in heuristic.items() if k not in config},
                          **{k: kwargs[k] for k in ("alignment",) if k in kwargs})
            space = {k: [v] for k, v in config.items()}
            key = sweep.make_key(name, B, sweep.bind_params(factory, params), space)
            db.begin_sweep(key, space, "grid", {}, force=False)
            db.record(key, Row(config, "timed", 1.0, 0.0, 3))
            db.finish_sweep(key)
    consult.reset()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["KERNFORGE_TUNE_DB"] = os.path.join(tmp, "tune.sqlite")
        os.environ.pop("KERNFORGE_TUNE", None)
        out["no database"] = measure(a.rounds, a.calls)
        record_all()
        out["every call tuned"] = measure(a.rounds, a.calls)
        out["topk op cache"] = [measure_stamp(a.rounds, a.calls)]
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    for state, rows in out.items():
        print(f"== {state}")
        print(f"{'chooser':16s} {'tuned us':>9s} {'heuristic us':>13s} {'added us':>9s} {'ratio':>6s}")
        for r in rows:
            print(f"{r['chooser']:16s} {r['tuned_us']:9.2f} {r['heuristic_us']:13.2f} {r['added_us']:9.2f} "
                  f"{r['ratio']:6.2f}")
        print(f"median added: {statistics.median(r['added_us'] for r in rows):.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
