"""The include closure: every file the compiler read, hashed by content.

The list comes from the compiler's own dependency output (``-MD -MF`` for
g++/clang/bisheng, the same flags for nvcc), never from a regex include walker:
a walker misses headers reached through macros, ``-include`` or ``CPATH``
(sglang's walker saw 8 of 1112 CUTLASS headers).

Each path is stored *anchored*: relative to the include directory (``inc<i>``)
or compiler system directory (``sys<i>``) that contains it, else absolute
(``abs``).  Two installs of the same package at different locations therefore
share entries, while a header outside every include dir is still tracked.

Validation resolves anchors against the *current* call and compares content
digests (stat-cached).  For a header found in include dir ``i > 0`` it also
checks that no earlier include dir has gained a file of the same relative
name, which the compiler would now pick up instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

from .hashing import StatCache


def parse_depfile(text: str) -> list[str]:
    """Prerequisites of a Make-style depfile (``\\ `` escapes a space)."""
    body = text.replace("\\\r\n", " ").replace("\\\n", " ")
    deps: list[str] = []
    for line in body.splitlines():
        if not line.strip():
            continue
        # The target is our own output path (no ':' in it); split at the
        # first ': ' so drive-less paths containing ':' later still parse.
        sep = line.find(": ")
        if sep < 0:
            if line.rstrip().endswith(":"):
                continue
            raise ValueError(f"unparsable depfile line: {line[:200]!r}")
        deps.extend(_split_escaped(line[sep + 2 :]))
    return deps


def _split_escaped(text: str) -> list[str]:
    out, current, i = [], [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in " #\\":
            current.append(text[i + 1])
            i += 2
            continue
        if ch == "$" and text[i + 1 : i + 2] == "$":
            current.append("$")
            i += 2
            continue
        if ch in " \t":
            if current:
                out.append("".join(current))
                current = []
        else:
            current.append(ch)
        i += 1
    if current:
        out.append("".join(current))
    return out


@dataclass(frozen=True)
class Anchors:
    """Directories that anchored paths are relative to, in priority order."""

    include_dirs: tuple[str, ...]
    system_dirs: tuple[str, ...]

    def named(self) -> list[tuple[str, str]]:
        return self._named

    @cached_property
    def _named(self) -> list[tuple[str, str]]:
        named = [(f"inc{i}", os.path.normpath(os.path.abspath(d))) for i, d in enumerate(self.include_dirs)]
        named += [(f"sys{i}", os.path.normpath(d)) for i, d in enumerate(self.system_dirs)]
        return named

    @cached_property
    def table(self) -> dict[str, str]:
        return dict(self._named)

    @cached_property
    def include_bases(self) -> list[str]:
        return [base for name, base in self._named if name.startswith("inc")]


def anchor_path(path: str, anchors: Anchors) -> tuple[str, str]:
    path = os.path.normpath(os.path.abspath(path))
    for name, base in anchors.named():
        if path.startswith(base.rstrip("/") + "/"):
            return name, os.path.relpath(path, base)
    return "abs", path


class ChangedDuringCompile(Exception):
    """A file the compiler read was modified after the compile started."""


def build_closure(deps: list[str], build_dir: str, anchors: Anchors, stats: StatCache,
                  started_ns: int | None = None) -> list[dict]:
    """Closure records for the files a compile read, build dir excluded.

    ``started_ns`` is the filesystem's own timestamp taken just before the
    compile.  A dependency modified after it may have been read in its old
    form while we hash the new one, which would publish a binary under the
    wrong key; that raises :class:`ChangedDuringCompile` instead.
    """
    build_dir = os.path.normpath(os.path.abspath(build_dir))
    records, seen = [], set()
    for dep in deps:
        full = os.path.normpath(os.path.abspath(dep if os.path.isabs(dep) else os.path.join(build_dir, dep)))
        if full.startswith(build_dir + "/") or full in seen:
            continue
        seen.add(full)
        digest = stats.digest(full)
        if digest is None:
            raise FileNotFoundError(f"compiler reported dependency {full} but it does not exist")
        if started_ns is not None:
            st = os.stat(full)
            if max(st.st_mtime_ns, st.st_ctime_ns) > started_ns:
                raise ChangedDuringCompile(full)
        anchor, rel = anchor_path(full, anchors)
        records.append({"anchor": anchor, "path": rel, "digest": digest})
    records.sort(key=lambda r: (r["anchor"], r["path"]))
    return records


def is_system(record: dict) -> bool:
    return record["anchor"].startswith("sys")


def check_closure(records, anchors: Anchors, stats: StatCache) -> str | None:
    """None when every recorded file still has its recorded content, else why not."""
    named = anchors.table
    include_bases = anchors.include_bases
    for record in records:
        anchor, rel = record["anchor"], record["path"]
        if anchor == "abs":
            full = rel
        elif anchor in named:
            full = os.path.join(named[anchor], rel)
        else:
            return f"include directory {anchor} of the entry is not given in this call"
        digest = stats.digest(full)
        if digest is None:
            return f"header {anchor}:{rel} no longer exists ({full})"
        if digest != record["digest"]:
            return f"header {anchor}:{rel} changed ({full})"
        if anchor.startswith("inc"):
            index = int(anchor[3:])
            for earlier in include_bases[:index]:
                if os.path.exists(os.path.join(earlier, rel)):
                    return f"header {rel} is now shadowed by {os.path.join(earlier, rel)}"
    return None


class ClosureWatch:
    """A loaded module's project headers, resolved once for per-hit checks.

    System headers (anchors ``sys<i>``) are validated when the module is
    loaded and not re-stated on each in-process hit: re-checking ~100 toolchain
    headers would cost ~200 us per call, and a toolchain is not upgraded under
    a running process.  Project headers (include dirs, absolute paths) are
    checked on every hit: one ``stat`` each, plus one per shadowing candidate.
    """

    def __init__(self, records, anchors: Anchors):
        self._items = []
        for record in records:
            anchor, rel = record["anchor"], record["path"]
            if is_system(record):
                continue
            full = rel if anchor == "abs" else os.path.join(anchors.table[anchor], rel)
            shadows = []
            if anchor.startswith("inc"):
                shadows = [os.path.join(base, rel) for base in anchors.include_bases[: int(anchor[3:])]]
            self._items.append((full, record["digest"], shadows, f"{anchor}:{rel}"))

    def stale(self, stats: StatCache) -> str | None:
        for full, digest, shadows, name in self._items:
            if stats.digest(full) != digest:
                return f"header {name} changed ({full})"
            for shadow in shadows:
                if os.path.exists(shadow):
                    return f"header {name} is now shadowed by {shadow}"
        return None
