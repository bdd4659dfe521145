"""Data checks and CUDA-graph capture.

The ops check the *values* of their index inputs (page ids, sequence lengths, expert ids,
row ends) before launch, so that a bad id is an error instead of a read of someone else's
memory.  Those checks read device memory on the host, which a CUDA-graph capture forbids.
While a capture is running, the ops skip them: the captured launch replays on whatever data
the buffers hold at replay time, so a check at capture time would prove nothing about it
anyway.  Run the op once eagerly first (torch's capture recipe does a warm-up anyway) to
have the inputs checked.
"""
from __future__ import annotations

import torch


def capturing(tensor: torch.Tensor) -> bool:
    """True while a CUDA graph is being captured on ``tensor``'s (CUDA) device's current stream."""
    return tensor.is_cuda and torch.cuda.is_current_stream_capturing()
