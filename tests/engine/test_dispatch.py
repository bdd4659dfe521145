"""Every aten op of a prefill + decode, attributed to the engine step that issued it.

Issue 15 wants the forward pass to be kernels only: no matmul, softmax, topk,
sort, reduction or elementwise float math in torch. Every step is a kernel now,
and these tests hold the code to it: float math outside a registered step fails
(a fallback crept in), float math inside a kernel step fails (the step's op fell
back to torch), and a kernel step that never ran fails (it was bypassed).
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernforge.engine import Engine, steps
from kernforge.model import random_model, tiny
from tests.engine.conftest import tokens

MATH_OPS = frozenset("""
mm bmm addmm addbmm baddbmm matmul linear dot einsum _softmax softmax _log_softmax topk sort
_scaled_dot_product_flash_attention_for_cpu scaled_dot_product_attention
sum mean amax amin aminmax max min prod cumsum linalg_vector_norm norm var std
exp exp2 log log1p log2 sigmoid silu tanh softplus relu neg abs sign reciprocal sqrt rsqrt pow
mul add sub rsub div addcmul addcdiv lerp clamp clamp_min clamp_max maximum minimum
round floor ceil trunc frexp ldexp copysign
""".split())


class Recorder(TorchDispatchMode):
    """(op name, step) for every aten op that computes on floating-point tensors."""

    def __init__(self):
        super().__init__()
        self.float_math: list[tuple[str, str | None]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__.rstrip("_")
        if name in MATH_OPS:
            tensors = [a for a in torch.utils._pytree.tree_leaves((args, kwargs, out)) if isinstance(a, torch.Tensor)]
            if any(t.is_floating_point() for t in tensors):
                self.float_math.append((name, steps.current_step()))
        return out


@pytest.fixture(scope="module")
def recorded():
    # one ratio-4 layer (indexer, hash routing) and one ratio-128 layer (scored routing):
    # every step runs, at half the cost of tiny()'s four layers
    model = random_model(tiny(num_hidden_layers=2, compress_ratios=(4, 128, 0), num_hash_layers=1), seed=0)
    eng = Engine(model, is_fp8_kvcache=True)  # so the FP8 page steps run too
    ids = tokens(21, seed=3)  # crosses the window and several ratio-4 entries
    eng.forward(ids[:, :20], 0)  # compile outside the recording
    with Recorder() as rec, steps.record() as calls:
        hidden = eng.forward_hidden(ids[:, :20], 0)
        eng.forward(ids[:, 20:], 20)
        eng.mtp_logits(hidden[:, :-1], ids[:, 1:20], 0)
    return rec.float_math, calls


def test_no_float_math_outside_a_registered_step(recorded):
    float_math, _ = recorded
    stray = sorted({op for op, where in float_math if where is None})
    assert not stray, f"torch float math outside any engine step (a fallback crept in): {stray}"


# Argument checks inside a kernel op, not compute: top2_sum_gate refuses NaN/Inf logits on the
# host (ops/routing.py `_check_finite`: upstream traps on the device): a screen by one
# torch.sum (a NaN or an infinity makes it non-finite), and only when it is not finite the
# exact mask, torch.isfinite (abs(x) != inf on the CPU), or the extremes by torch.aminmax.
# Nothing it computes reaches the forward pass.
ARGUMENT_CHECKS = {("sum", "routing"), ("abs", "routing"), ("aminmax", "routing")}


def test_kernel_steps_do_no_torch_math(recorded):
    float_math, _ = recorded
    kernel = set(steps.kernel_steps())
    leaks = sorted({(op, where) for op, where in float_math if where in kernel} - ARGUMENT_CHECKS)
    assert not leaks, leaks


def test_every_kernel_step_ran(recorded):
    """A kernel step that silently fell back to a torch path would either show math in
    the tests above or be missing here."""
    _, calls = recorded
    assert set(steps.kernel_steps()) <= set(calls), sorted(set(steps.kernel_steps()) - set(calls))


def test_forward_pass_is_kernels_only(recorded):
    """Issue 15's goal, reached: no step is left in torch, and no aten float math runs in a
    prefill + decode besides the routing op's argument check."""
    float_math, _ = recorded
    assert not steps.torch_steps(), steps.torch_steps()
    assert not set(float_math) - ARGUMENT_CHECKS, sorted({op for op, _ in set(float_math) - ARGUMENT_CHECKS})
