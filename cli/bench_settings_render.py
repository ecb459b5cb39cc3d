"""bench's first output, before any number: each target's engine settings, whether they are alike, what was not read."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from hybridserve.core.bench.likeness.alike import Likeness, TargetSettings
from hybridserve.core.bench.likeness.engine_settings import Memory, Setting


def render_settings(console: Console, settings: tuple[TargetSettings, ...], likeness: Likeness | None) -> None:
    if likeness is not None:
        for i, line in enumerate(likeness.lines()):
            style = "bold red" if i == 0 and not likeness.is_like else None
            console.print(line, style=style, highlight=False, markup=False, soft_wrap=True)
    if not settings:
        return
    table = Table(title="engine settings (P/D: prefill and decode of one deployment together)")
    table.add_column("setting")
    for t in settings:
        table.add_column(t.role)
    differ = {d.setting for d in likeness.differences} if likeness else set()
    for setting in Setting:
        mark = " (differs)" if setting in differ else ""
        table.add_row(f"{setting.value}{mark}", *[t.value(setting) or "not read" for t in settings],
                      style="red" if mark else None)
    console.print(table)


def _reading(value: Any) -> Any:  # noqa: ANN401 (str | Memory)
    if isinstance(value, Memory):
        return {"share": value.share, "kv_cache_bytes": value.kv_cache_bytes,
                "gpus": list(value.gpus) if value.gpus is not None else None}
    return value


def settings_dict(settings: tuple[TargetSettings, ...], likeness: Likeness | None) -> dict[str, Any]:
    """--json: each target's value per setting (None: not read), each engine's readings with their source, and
    the comparison."""
    targets = {t.role: {
        "num_gpus": t.num_gpus,
        "values": {s.value: t.value(s) for s in Setting},
        "engines": {e.name: {s.value: {"value": _reading(r.value), "source": r.source} for s, r in e.readings.items()}
                    for e in t.engines},
        "front": {s.value: {"value": r.value, "source": r.source} for s, r in t.front.items()}}
        for t in settings}
    comparison = None if likeness is None else {
        "is_like": likeness.is_like, "lines": likeness.lines(),
        "differences": [{"setting": d.setting.value, "values": d.values} for d in likeness.differences],
        "unread": [{"role": u.role, "setting": u.setting.value, "why": u.why} for u in likeness.unread]}
    return {"targets": targets, "likeness": comparison}
