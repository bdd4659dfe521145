"""Every engine step that is not a kernforge kernel yet, in one module.

Why one module: issue 15 asks for a forward pass made of kernforge kernels.
Until each of these is replaced, it runs here as torch code (mostly the
reference model's own functions, so it is the oracle's arithmetic), and the
table below is the honest list of what is left. Replacing a step means
writing its kernel, registering it as a "kernel" step (`kernel_steps.py`) and
deleting it here; `tests/engine/test_dispatch.py` then fails until this
table is updated, and fails too if a torch fallback appears outside it.

| step | what it computes | kernel that replaces it |
|---|---|---|

The table is empty: every FLOP-carrying step is a kernel now (issue 15), and
`test_forward_pass_is_kernels_only` holds the forward pass to that. A new torch
step registers here (`@step(name, "torch", ...)`) with a row above.

Kernel steps: `sparse_mla` and `indexer_topk` (registered in `engine.py`), and in
`kernel_steps.py` `embedding`, `rms_norm`, `rope`, `hadamard`, `hc_pre`, `hc_post`,
`hc_head`, `routing`, `moe_mapping`, `moe_expand`, `swiglu`, `indexer_scores`,
`fp8_kv_quantize`, `fp8_kv_dequantize`, `kv_fake_quant`, `indexer_fp4_round`,
`compressor_pool` (docs/engine.md), and on the dense GEMM
(`ops.fp32_gemm_nn`) `linear`, `router_logits`, `grouped_output`, `attention_input`
and `expert_gemm`, and `moe_reduce` (`ops.reduce_fused`). The MTP input's add is the
`linear` step's `c` (h_proj(hnorm(x)) + e).
"""
