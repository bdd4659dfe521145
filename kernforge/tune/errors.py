"""The tuner's errors: one family (``TuneError``, a ``ValueError``) whose messages name the
kernel, tunable or value at fault.  A module of its own because the key functions
(:mod:`.keys`), which the ops' lookups use too, raise them without importing the sweep."""
from __future__ import annotations


class TuneError(ValueError):
    """A tuning request that cannot run; the message names the kernel, tunable or value."""


class UnknownKernelError(TuneError):
    """Not a registry kernel (``kernforge list`` shows them)."""


class UnknownTunableError(TuneError):
    """A space key that is not one of the factory's ``@T.tunable`` parameters."""


class EmptySpaceError(TuneError):
    """A space with no configuration in it (an empty list of values, or nothing tunable)."""


class BadShapeError(TuneError):
    """A problem parameter the kernel does not have, or a value it cannot take."""
