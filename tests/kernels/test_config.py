"""The configuration choosers are the one home of tile sizes: the catalogue's production
problems are their output, they key on a backend's language (not its name), and every
specialisation gets its own artifact name."""
import os
import subprocess
import sys

import pytest

from kernforge import backends
from kernforge.backends import registry as backend_table
from kernforge.kernels import grouped_gemm as G
from kernforge.kernels import mla_decode as M
from kernforge.kernels import topk as K
from kernforge.kernels.registry import get


def _compile_time(spec, label):
    return {k: v for k, v in spec.problems[label].params.items() if k not in spec.runtime_sizes}


def test_mla_problems_are_the_choosers_output():
    dense = get("mla_decode")
    assert _compile_time(dense, "small") == M.config.choose(
        "cpu", heads=8, heads_kv=1, seq_q=2, dim=96, dim_v=64, page_size=16, causal=True)
    assert _compile_time(dense, "demo") == M.config.choose("cuda", heads=64, dim=576, dim_v=512)
    # bench is the H100/H200 configuration: 64-token tiles for the seesaw (32 on other arches)
    assert _compile_time(dense, "bench") == M.config.choose("cuda", heads=128, dim=576, dim_v=512, arch="sm_90a")
    assert _compile_time(dense, "bench")["block_N"] == 64
    for arch in (None, "sm_80", "sm_100a"):
        assert M.config.choose("cuda", heads=128, dim=576, dim_v=512, arch=arch)["block_N"] == 32
    assert M.config.choose("cpu", heads=128, dim=576, dim_v=512, arch="sm_90a")["block_N"] == 64  # host: pages
    sparse = get("mla_decode_sparse")
    small = M.config.choose_sparse("cpu", heads=8, topk=24, seq_q=2, dim=96, dim_v=64)
    assert _compile_time(sparse, "small") == dict(small, block_N=16)   # block_N pinned (two tiles)
    assert _compile_time(sparse, "demo") == M.config.choose_sparse("cuda", heads=64, topk=512, dim=512, dim_v=512)
    assert _compile_time(sparse, "bench") == M.config.choose_sparse("cuda", heads=128, topk=2048, seq_q=2)


def test_grouped_gemm_bench_problems_are_the_choosers_output():
    assert _compile_time(get("m_grouped_gemm_nt_contiguous"), "bench") == G.config.choose(
        "cuda", num_groups=4, N=4096, K=2048, alignment=128)
    assert _compile_time(get("m_grouped_fp8_gemm_nt_contiguous"), "bench") == G.config.choose_fp8(
        "cuda", num_groups=4, N=4096, K=2048, alignment=128)
    assert _compile_time(get("m_grouped_gemm_nt_masked"), "bench") == G.config.choose_masked(
        "cuda", num_groups=32, N=4096, K=2048, expected_m=192)


def test_choosers_key_on_the_language_not_the_name(monkeypatch):
    """A new backend writing CUDA on host buffers gets the CUDA tiles, and (its buffers
    not being on a CUDA device) no split-KV."""
    monkeypatch.setitem(backend_table._ENTRIES, "toy-gpu",
                        backends.Entry("toy-gpu", None, device="cpu", lang="cuda"))
    for chooser, args in ((K.config.choose, (512, "bfloat16", "int32")),
                          (M.config.choose, (64, 1, 2)),
                          (M.config.choose_sparse, (64, 512)),
                          (M.config.choose_combine, (64, 4)),
                          (G.config.choose, (4, 256, 512)),
                          (G.config.choose_fp8, (4, 256, 512)),
                          (G.config.choose_masked, (4, 256, 512, 100))):
        assert chooser("toy-gpu", *args) == chooser("cuda", *args)
        assert chooser("cuda-emu", *args) == chooser("cuda", *args)
    assert K.config.choose("interp", 16) != K.config.choose("cpu", 16)
    assert M.config.split_count("toy-gpu", 1, 10_000, None) == 1
    assert M.config.split_count("cuda-emu", 1, 10_000, None) == 1
    with pytest.raises(backends.BackendError, match="unknown backend"):
        K.config.choose("nope", 16)


def test_artifact_name_follows_the_compile_time_parameters():
    a = K.topk_select(**K.config.choose("cpu", 512))
    b = K.topk_select(**K.config.choose("interp", 512))
    c = K.topk_select(**K.config.choose("cpu", 64))
    assert a.ir.name == b.ir.name == c.ir.name == "topk_select_kernel"   # the source's entry symbol
    assert len({a.artifact_name, b.artifact_name, c.artifact_name}) == 3
    assert a.artifact_name.startswith("topk_select_kernel_k512_float32_int64_")
    assert a.artifact_name == a.ir.artifact_name
    # equal parameters: equal names, in this process (a fresh trace) and in another one
    again = K.topk_select.fn(**K.topk_select.bind(**K.config.choose("cpu", 512)))
    again.ir.attrs.update(a.ir.attrs)
    assert again.artifact_name == a.artifact_name
    code = ("from kernforge.kernels import topk as K; "
            "print(K.topk_select(**K.config.choose('cpu', 512)).artifact_name)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "123"})
    assert out.stdout.strip() == a.artifact_name
    # long names that already carry their parameters just get the digest
    m = M.mla_decode(heads=8)
    assert m.artifact_name.startswith(m.ir.name + "_") and len(m.artifact_name) == len(m.ir.name) + 9
