"""How a tuning result is keyed: a factory's parameters bound with its defaults, the shape
bucket (every scalar, non-tunable parameter by exact value) and the database key.  Shared by
the sweep (which records results under a key) and the choosers' lookup (:mod:`.consult`,
which finds them again on an op's path), so the lookup needs nothing of the sweep."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import kernforge
from kernforge.tune import identity
from kernforge.tune.db import Key, canonical
from kernforge.tune.errors import BadShapeError

if TYPE_CHECKING:
    from kernforge.kernels.registry import KernelSpec


def bind_params(factory, params: dict, spec: Optional[KernelSpec] = None) -> dict:
    """``params`` with ``factory``'s defaults filled in for its own parameters; the others
    (a spec's runtime sizes) pass through.  With ``spec``, :class:`BadShapeError` names a
    parameter that is neither, or a required one that is missing."""
    sig = getattr(factory, "signature", None)
    if sig is None:
        return dict(params)
    own = {k: v for k, v in params.items() if k in sig.parameters}
    rest = {k: v for k, v in params.items() if k not in sig.parameters}
    if spec is not None:
        for k in rest:
            if k not in spec.runtime_sizes:
                raise BadShapeError(f"{spec.name} has no parameter {k!r} (its parameters: "
                                    f"{', '.join(sorted(set(sig.parameters) | set(spec.runtime_sizes)))})")
    try:
        own = factory.bind(**own)
    except TypeError as e:
        raise BadShapeError(str(e)) from None
    return dict(own, **rest)


def shape_bucket(params: dict, tunables) -> dict:
    """The key's shape bucket: every scalar, non-tunable parameter by exact value (see
    :class:`~kernforge.tune.db.Key`)."""
    return {k: v for k, v in params.items()
            if k not in tunables and not isinstance(v, (list, tuple, dict))}


def make_key(kernel: str, backend: str, params: dict, tunables) -> Key:
    """``params`` must be bound (:func:`bind_params`), so that a default spelled out and a
    default left out give one key."""
    bucket = shape_bucket(params, tunables)
    dtype = ",".join(str(bucket[k]) for k in sorted(bucket) if "dtype" in k) or "-"
    return Key(kernel, canonical(bucket), dtype, backend, identity.device(backend), identity.compiler(backend),
               kernforge.__version__)
