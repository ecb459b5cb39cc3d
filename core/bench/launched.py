"""The engines of a deployment that hybridserve launched: their command lines, environment and logs.

A run folder (core/supervise/runner.py) holds `plan.json` (every role's argv, env and URL) and one `<role>.log` each.
bench reads it for the configurations it starts, and for a URL target that a live `hybridserve launch` run under
`--run-dir` serves (stale_run.py: a run whose roles are alive), so its flags and logs say what the server runs with.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hybridserve.core.common.contracts import PLAN_FILE
from hybridserve.core.host.stale_run import find_live_runs
from hybridserve.core.launch.engine_command import API_SERVER_MODULE


@dataclass(frozen=True, kw_only=True)
class LaunchedEngine:
    name: str  # "prefill-0", "decode-0", "single-0"
    url: str
    argv: tuple[str, ...]
    env: dict[str, str]
    log_path: Path | None  # None: not started yet (a plan bench has not run)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace") if self.log_path is not None else ""
        except OSError:
            return ""


def engines_of_plan(commands, run_dir: Path | None = None) -> tuple[LaunchedEngine, ...]:  # noqa: ANN001
    """From a LaunchPlan's commands (or plan.json's entries as dicts): its vLLM servers, in the plan's order."""
    out = []
    for c in commands:
        name, url, argv, env = ((c["name"], c["url"], c["argv"], c["env"]) if isinstance(c, dict)
                                else (c.name, c.url, c.argv, dict(c.env)))
        if API_SERVER_MODULE in argv:
            out.append(LaunchedEngine(name=name, url=url.rstrip("/"), argv=tuple(argv), env=dict(env),
                                      log_path=run_dir / f"{name}.log" if run_dir is not None else None))
    return tuple(out)


def read_run(run_dir: Path) -> tuple[list[dict], tuple[LaunchedEngine, ...]]:
    """plan.json's entries and the engines among them; ([], ()) when there is no readable plan."""
    try:
        entries = json.loads((run_dir / PLAN_FILE).read_text())
    except (OSError, ValueError):
        return [], ()
    if not isinstance(entries, list):
        return [], ()
    return entries, engines_of_plan([e for e in entries if isinstance(e, dict) and "argv" in e], run_dir)


def find_launched(run_root: Path, url: str) -> tuple[LaunchedEngine, ...]:
    """The engines behind `url` in the newest live run under `run_root` that serves it: all of them for its
    proxy, the one for an engine's own URL; () when no live run serves it."""
    url = url.rstrip("/")
    if not run_root.is_dir():
        return ()
    for run in reversed(find_live_runs(run_root)):
        entries, engines = read_run(run.run_dir)
        if any(e.url == url for e in engines):
            return tuple(e for e in engines if e.url == url)
        if any(str(e.get("url", "")).rstrip("/") == url for e in entries):
            return engines
    return ()
