"""Races between threads on shared memory, for the interpreter's thread maps.

Thread-level code (``kernforge.dsl.compat``) runs as thread maps: ``T.Parallel`` loops over the
block's threads, one per stretch between two barriers.  The interpreter runs a map in lockstep,
one statement at a time over all threads, so a program that reads shared memory another thread
wrote in the same stretch would silently get the answer of a barrier that is not there; cpu
(threads one after another) and CUDA (threads in any order) would not.  As the oracle, the
interpreter reports such a pair instead: :class:`ThreadRaceError`, naming the buffer, the
element, the two threads and the author's line.

Per shared buffer touched in the current map, one writer and one reader per element:

* writer: ``-1`` none, a thread id, ``SAME`` several threads stored one value (allowed, as on a
  GPU), ``ATOMIC`` several threads updated it with atomics; beside it, whether every write so far
  was an atomic (so that one thread's atomic and another's later one are no race);
* reader: ``-1`` none, a thread id, ``MANY`` several threads.

A conflict is two different threads touching one element, at least one of them writing, unless
both are atomics or both store the same value.  A read of a ``SAME`` element is allowed (every
writer left the value it reads).  Tile operations (``T.copy``, ``T.fill``) inside a thread map
are not tracked.
"""
from __future__ import annotations

import numpy as np

from kernforge.codegen import ir

SAME, ATOMIC, MANY = -2, -3, -2


class ThreadRaceError(ir.KernelError):
    """Two threads of a block touch one shared element between the same two barriers, at least
    one of them writing: the result depends on their order."""


class SharedAccessLog:
    """The accesses of one thread map to shared memory (module docstring)."""

    def __init__(self):
        self.logs: dict = {}

    def _log(self, buf: ir.Buffer, arr: np.ndarray):
        log = self.logs.get(buf)
        if log is None:
            log = self.logs[buf] = (np.full(arr.size, -1, np.int64), np.full(arr.size, -1, np.int64),
                                    np.ones(arr.size, bool))
        return log

    @staticmethod
    def _groups(flat, tid):
        """Per accessed element: whether more than one thread accesses it in this statement."""
        uniq, inv = np.unique(flat, return_inverse=True)
        inv = inv.reshape(-1)
        lo = np.full(len(uniq), np.iinfo(np.int64).max)
        hi = np.full(len(uniq), -1)
        np.minimum.at(lo, inv, tid)
        np.maximum.at(hi, inv, tid)
        return (lo != hi)[inv]

    @staticmethod
    def _fail(buf, arr, flat, k, what):
        where = list(np.unravel_index(int(flat[k]), arr.shape))
        raise ThreadRaceError(f"{what} shared {buf.name}{[int(i) for i in where]} with no barrier between "
                              "(a race: the result depends on the threads' order); put T.sync_threads() at the top level of "
                              "the kernel block between the two accesses")

    def read(self, buf, arr, flat, tid) -> None:
        writer, reader, _ = self._log(buf, arr)
        w = writer[flat]
        bad = (w == ATOMIC) | ((w >= 0) & (w != tid))
        if bad.any():
            k = int(np.argmax(bad))
            who = f"thread {int(w[k])}" if w[k] >= 0 else "several threads' atomics"
            self._fail(buf, arr, flat, k, f"thread {int(tid[k])} reads what {who} wrote to")
        r = reader[flat]
        new = np.where((r == -1) | (r == tid), tid, MANY)
        new[self._groups(flat, tid)] = MANY
        reader[flat] = new
        reader[flat[new == MANY]] = MANY  # a duplicate index may have assigned a thread id last

    def write(self, buf, arr, flat, tid, vals, atomic: bool = False) -> None:
        writer, reader, atomics = self._log(buf, arr)
        r = reader[flat]
        bad = (r == MANY) | ((r >= 0) & (r != tid))
        if bad.any():
            k = int(np.argmax(bad))
            who = f"thread {int(r[k])}" if r[k] >= 0 else "other threads"
            self._fail(buf, arr, flat, k, f"thread {int(tid[k])} overwrites what {who} read from")
        w = writer[flat]
        by_atomics = (w == ATOMIC) | ((w >= 0) & atomics[flat])  # every earlier write an atomic
        other = (w == SAME) | (w == ATOMIC) | ((w >= 0) & (w != tid))
        multi = self._groups(flat, tid)
        if atomic:
            bad = other & ~by_atomics
            new = np.where(multi | other, ATOMIC, tid)
            atomics[flat] = (w == -1) | by_atomics
        else:
            same = same_bits(vals) == same_bits(arr.reshape(-1)[flat])
            bad = other & (by_atomics | ~same)
            new = np.where(multi | other, SAME, tid)
            atomics[flat] = False
        if bad.any():
            k = int(np.argmax(bad))
            who = f"thread {int(w[k])}" if w[k] >= 0 else "other threads"
            self._fail(buf, arr, flat, k, f"thread {int(tid[k])} {'updates' if atomic else 'writes'} what "
                       f"{who} wrote to")
        writer[flat] = new
        marked = new < 0
        writer[flat[marked]] = new[marked]  # a duplicate index may have assigned a thread id last


def same_bits(a: np.ndarray) -> np.ndarray:
    """``a``'s elements as unsigned integers of their width: equal exactly when the stored bits
    are (NaNs included)."""
    a = np.ascontiguousarray(a)
    return a.view(np.dtype(f"u{a.dtype.itemsize}")) if a.dtype.itemsize in (1, 2, 4, 8) else a
