"""Pictures for xpu-perf (matplotlib, an optional dependency: `pip install xpuremote[plot]`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("xpu-perf: plots need matplotlib (pip install 'xpuremote[plot]')") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def heatmap(rtts_us: Sequence[float], gbps: Sequence[float], slowdown: Sequence[Sequence[float]],
            title: str, out: Path) -> None:
    """slowdown[i][j] at gbps[i], rtts_us[j]; contours at 5%, 10% and 50%."""
    plt = _pyplot()
    import numpy as np

    grid = np.array(slowdown)
    fig, ax = plt.subplots(figsize=(7, 5))
    mesh = ax.pcolormesh(rtts_us, gbps, grid, shading="nearest", cmap="viridis_r",
                         norm=_log_norm(grid))
    fig.colorbar(mesh, ax=ax, label="slowdown (× the recorded run)")
    lines = ax.contour(rtts_us, gbps, grid, levels=[1.05, 1.10, 1.50], colors=["white", "orange", "red"])
    ax.clabel(lines, fmt={1.05: "5%", 1.10: "10%", 1.50: "50%"}, inline=False, fontsize=9)
    ax.set(xscale="log", yscale="log", xlabel="round-trip time (µs)", ylabel="bandwidth (Gbit/s)", title=title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _log_norm(grid: Any) -> Any:
    from matplotlib.colors import LogNorm

    return LogNorm(vmin=max(grid.min(), 1.0), vmax=max(grid.max(), 1.01))


def validation(points: Sequence[dict[str, Any]], title: str, out: Path) -> None:
    """Predicted against measured run time, one marker per (program, link)."""
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 6))
    for label in sorted({p["label"] for p in points}):
        mine = [p for p in points if p["label"] == label]
        ax.scatter([p["measured_s"] for p in mine], [p["predicted_s"] for p in mine], label=label, s=28)
    low = min(min(p["measured_s"], p["predicted_s"]) for p in points) * 0.8
    high = max(max(p["measured_s"], p["predicted_s"]) for p in points) * 1.25
    ax.plot([low, high], [low, high], color="black", linewidth=1)
    for band, style in ((0.05, "--"), (0.10, ":")):
        ax.plot([low, high], [low * (1 + band), high * (1 + band)], style, color="grey", linewidth=1)
        ax.plot([low, high], [low * (1 - band), high * (1 - band)], style, color="grey", linewidth=1)
    ax.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high), xlabel="measured run time (s)",
           ylabel="predicted run time (s)", title=title)
    for axis in (ax.xaxis, ax.yaxis):  # plain numbers at 1-2-5 steps: minor labels run into each other
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())
    ax.legend(title="dashed ±5%, dotted ±10%", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
