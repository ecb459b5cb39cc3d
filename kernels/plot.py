"""The tune plot: per TP, the speedup over fla of FlashInfer-auto and of the tuned dispatch, per batch shape."""

from __future__ import annotations

from pathlib import Path

from hybridserve.core.common.atomic_file import write_figure
from hybridserve.core.common.errors import MissingExtraError
from hybridserve.kernels.tuned_profile import TunedProfile


def write_plot(profile: TunedProfile, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingExtraError("matplotlib", "cpu", "the tune plot (--plot)") from None
    tps = sorted({e.tp for e in profile.entries})
    fig, axes = plt.subplots(1, max(1, len(tps)), figsize=(4.2 * max(1, len(tps)), 3.8), squeeze=False, sharey=True)
    for ax, tp in zip(axes[0], tps):
        rows = [e for e in profile.entries if e.tp == tp]
        labels = [f"{e.num_seqs}x{e.seq_len}" for e in rows]
        base = [e.fla_ms or e.times_ms[max(e.times_ms, key=e.times_ms.get)] for e in rows]
        series = {"FlashInfer auto": [b / e.flashinfer_auto_ms if e.flashinfer_auto_ms else 0
                                      for b, e in zip(base, rows)],
                  "tuned": [b / e.winner_ms for b, e in zip(base, rows)]}
        width = 0.38
        for i, (name, values) in enumerate(series.items()):
            ax.bar([x + (i - 0.5) * width for x in range(len(rows))], values, width, label=name)
        ax.set_xticks(range(len(rows)), labels, rotation=30)
        ax.set_title(f"TP{tp}: {rows[0].num_key_heads}/{rows[0].num_value_heads} heads")
        ax.axhline(1.0, color="grey", lw=0.8)
    axes[0][0].set_ylabel("speedup over fla" if profile.entries and profile.entries[0].fla_ms else
                          "speedup over slowest setting")
    axes[0][-1].legend()
    fig.suptitle(f"GDN prefill, {profile.model}, {profile.dtype}, {profile.gpu}", fontsize=9)
    fig.tight_layout()
    write_figure(path, fig)
