"""The bench PNG: TTFT and ITL percentiles per target, one panel pair per phase (probes' TTFT beside the load's)."""

from __future__ import annotations

from pathlib import Path

from hybridserve.core.bench.comparison import BenchReport
from hybridserve.core.common.atomic_file import write_figure
from hybridserve.core.common.errors import MissingExtraError

_PERCENTILES = ("p50", "p90", "p99")


def write_png(report: BenchReport, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingExtraError("matplotlib", "cpu", "the bench plot (--png)") from None
    num = len(report.phases)
    fig, axes = plt.subplots(num, 2, figsize=(10, 3.4 * num), squeeze=False)
    width = 0.8 / max(1, len(report.targets))
    for row, work in zip(axes, report.phases):
        index = report.phases.index(work)
        for k, target in enumerate(report.targets):
            phase = target.phases[index]
            series = [("ttft_s", row[0], phase.client), ("itl_s", row[1], phase.client)]
            for field, ax, summary in series:
                values = [(getattr(getattr(summary, field), p) or 0.0) * 1e3 for p in _PERCENTILES]
                ax.bar([x + k * width for x in range(3)], values, width, label=target.role)
            if phase.probes is not None:
                value = (phase.probes.ttft_s.p50 or 0.0) * 1e3
                row[0].bar(3 + k * width, value, width, color=f"C{k}", hatch="//")
        labels = list(_PERCENTILES)
        row[0].set_xticks([x + 0.4 - width / 2 for x in range(4 if work.spec.probe else 3)],
                          labels + (["probe p50"] if work.spec.probe else []))
        row[1].set_xticks([x + 0.4 - width / 2 for x in range(3)], labels)
        row[0].set_ylabel("TTFT ms")
        row[1].set_ylabel("ITL ms")
        row[0].set_title(work.spec.name, fontsize=8)
        row[1].legend(fontsize=7)
    fig.tight_layout()
    write_figure(path, fig)
