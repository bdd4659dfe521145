"""The sweep as a picture: median time over a grid of one or two tunables, with rejected
configurations marked, as a PNG (``kernforge tune ... --png FILE``).

A table ranks configurations; a heatmap shows the shape of the space (which tunable
matters, where the cliff is, which corner fails to compile), which is what one looks at
before narrowing a space by hand.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


class HeatmapError(ValueError):
    """Axes that are not tunables of the sweep; the message names them."""


@dataclass
class Grid:
    """``ms[i][j]``: the best median at ``y = ys[i]``, ``x = xs[j]`` over the other tunables
    (NaN: nothing timed there); ``rejected``: the cells where some configuration failed,
    as (j, i) pairs; ``y`` is None for a one-tunable sweep (one row)."""

    x: str
    y: str | None
    xs: list
    ys: list
    ms: list[list[float]]
    rejected: set[tuple[int, int]]


def axes_of(result, axes: str | None) -> tuple[str, str | None]:
    """``axes`` ("X,Y" or "X") checked against the sweep; by default the first two tunables
    swept with several values (one if only one was)."""
    names = [n.strip() for n in axes.split(",") if n.strip()] if axes else \
        [k for k, v in result.space.items() if len(v) > 1][:2]
    if not names:
        raise HeatmapError("no tunable was swept with more than one value: nothing to draw")
    if len(names) > 2 or len(set(names)) != len(names):
        raise HeatmapError(f"--axes takes one or two different tunables, got {','.join(names)}")
    for n in names:
        if n not in result.space:
            raise HeatmapError(f"--axes {n!r} is not a tunable of the sweep ({', '.join(result.space)})")
    return names[0], names[1] if len(names) == 2 else None


def grid(result, x: str, y: str | None) -> Grid:
    xs = list(result.space[x])
    ys = list(result.space[y]) if y else [None]
    ms = [[math.nan] * len(xs) for _ in ys]

    def cell(config):
        return xs.index(config[x]), ys.index(config[y]) if y else 0

    for r in result.ranked:
        if r.status == "timed":
            j, i = cell(r.config)
            ms[i][j] = r.median_ms if math.isnan(ms[i][j]) else min(ms[i][j], r.median_ms)
    return Grid(x, y, xs, ys, ms, {cell(r.config) for r in result.rejected})


def draw(result, path: str, axes: str | None = None) -> Grid:
    """Write the PNG; returns the grid it drew."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed, and none is there on a server
    import matplotlib.pyplot as plt

    g = grid(result, *axes_of(result, axes))
    fig, ax = plt.subplots(figsize=(max(5.0, 2.5 + 0.9 * len(g.xs)), max(3.0, 1.6 + 0.7 * len(g.ys))))
    im = ax.imshow(g.ms, origin="lower", cmap="viridis_r", aspect="auto")
    ax.set_xticks(range(len(g.xs)), [str(v) for v in g.xs])
    ax.set_xlabel(g.x)
    if g.y:
        ax.set_yticks(range(len(g.ys)), [str(v) for v in g.ys])
        ax.set_ylabel(g.y)
    else:
        ax.set_yticks([])
    for i, row in enumerate(g.ms):
        for j, v in enumerate(row):
            if not math.isnan(v):
                ax.text(j, i, f"{v:.3g}", ha="center", va="center", color="white", fontsize=8)
    if g.rejected:
        ax.scatter([j for j, _ in g.rejected], [i for _, i in g.rejected], marker="x", s=160, c="red",
                   linewidths=2, label="rejected")
    fig.colorbar(im, label="median ms")
    ax.set_title(f"{result.kernel} on {result.backend}\nbest over the other tunables; x: rejected", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return g
