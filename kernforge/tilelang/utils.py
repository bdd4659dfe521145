"""``tilelang.utils`` / ``tilelang.utils.tensor``: the comparison helper TileLang's examples
check themselves with."""
from __future__ import annotations

import sys


def torch_assert_close(tensor_a, tensor_b, rtol: float = 1e-2, atol: float = 1e-3,
                       max_mismatched_ratio: float = 0.001, verbose: bool = False, equal_nan: bool = True,
                       check_device: bool = True, check_dtype: bool = True, check_layout: bool = True,
                       check_stride: bool = False, base_name: str = "LHS", eval_name: str = "RHS") -> None:
    """TileLang's ``torch_assert_close``: like ``torch.testing.assert_close`` but at most
    ``max_mismatched_ratio`` of the elements may miss ``atol + rtol * |b|``.  Shapes must
    match; with ``check_dtype`` so must dtypes, with ``check_device`` devices."""
    import torch

    if tensor_a.shape != tensor_b.shape:
        raise AssertionError(f"{base_name} shape {tuple(tensor_a.shape)} != {eval_name} shape {tuple(tensor_b.shape)}")
    if check_dtype and tensor_a.dtype != tensor_b.dtype:
        raise AssertionError(f"{base_name} dtype {tensor_a.dtype} != {eval_name} dtype {tensor_b.dtype}")
    if check_device and tensor_a.device != tensor_b.device:
        raise AssertionError(f"{base_name} device {tensor_a.device} != {eval_name} device {tensor_b.device}")
    a, b = tensor_a.double().cpu(), tensor_b.double().cpu()
    bad = ~torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan)
    ratio = bad.double().mean().item() if bad.numel() else 0.0
    if ratio > max_mismatched_ratio:
        diff = (a - b).abs().nan_to_num(float("inf")).max().item()
        raise AssertionError(f"{ratio:.4%} of elements of {base_name} and {eval_name} mismatch (allowed "
                             f"{max_mismatched_ratio:.4%}), max abs diff {diff:g}")
    if verbose:
        print(f"{base_name} and {eval_name} match ({ratio:.4%} of elements mismatch)")


tensor = sys.modules[__name__]
