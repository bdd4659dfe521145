"""The V4-Flash inference engine: the reference model's weights over a paged KV cache.

`Engine(model, backend="cpu")` runs `kernforge.model.Transformer`'s forward pass
with its own paged caches (`cache.PagedKVCache`), calling kernforge kernels for
the steps that have one; `Engine.steps()` says which those are (docs/engine.md); `steps` is the
registry (every step is a kernel now; a torch fallback would register as kind "torch").
"""

from kernforge.engine.allocator import BlockAllocator, CacheFullError
from kernforge.engine.cache import BLOCK_SIZE, CacheKind, Fp8KVLayout, PagedKVCache
from kernforge.engine.engine import Engine

__all__ = ["BLOCK_SIZE", "BlockAllocator", "CacheFullError", "CacheKind", "Engine", "Fp8KVLayout",
           "PagedKVCache"]
