"""Before bench measures: every target's engine settings, compared, and the refusal of unlike targets.

Read before anything starts: each URL target (from its live launch run under --run-dir, else its /metrics) and
each configuration bench will start (from the command lines of its plan). A started configuration is read again once
it serves (its log and /metrics: what vLLM resolved), before its phases run. A difference refuses the run (exit 2,
one line) unless `allow_unlike`; then the report marks it before any number (Likeness.lines).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hybridserve.core.bench.launched import engines_of_plan, find_launched, read_run
from hybridserve.core.bench.likeness.alike import Likeness, TargetSettings, compare
from hybridserve.core.bench.likeness.readings import launched_settings, url_settings
from hybridserve.core.bench.served_model import served_model
from hybridserve.core.common.errors import InputError
from hybridserve.core.deployments.client import auth_headers
from hybridserve.core.deployments.deployed import config_plan, config_topology
from hybridserve.core.deployments.target import default_model


class UnlikeTargetsError(InputError):
    """The targets differ in an engine setting other than the P/D split (exit 2)."""


class SettingsBook:
    """The latest settings of every target, by role, in the targets' order."""

    def __init__(self, *, allow_unlike: bool, gpus: dict[str, int]) -> None:
        self.allow_unlike, self.gpus = allow_unlike, gpus
        self.by_role: dict[str, TargetSettings] = {}

    def read_url(self, client: Any, role: str, url: str, *, run_root: Path, headers: dict | None,
                 name: str | None) -> None:
        card = served_model(client, url, name, headers)
        launched = find_launched(run_root, url)
        self.by_role[role] = (launched_settings(client, role, launched, max_model_len=card.max_model_len,
                                                num_gpus=self.gpus.get(role)) if launched else
                              url_settings(client, role, url, max_model_len=card.max_model_len,
                                           num_gpus=self.gpus.get(role), run_root=run_root))

    def read_plan(self, role: str, plan: Any) -> None:
        """A configuration not started yet: the flags its plan gives its engines."""
        self.by_role[role] = launched_settings(None, role, engines_of_plan(plan.commands))

    def read_started(self, client: Any, role: str, run_dir: Path, max_model_len: int | None) -> None:
        _, engines = read_run(run_dir)
        self.by_role[role] = launched_settings(client, role, engines, max_model_len=max_model_len)

    @property
    def targets(self) -> tuple[TargetSettings, ...]:
        return tuple(self.by_role.values())

    def check(self) -> Likeness:
        """Compare what is read so far; refuse unlike targets unless allowed."""
        likeness = compare(self.targets)
        if not likeness.is_like and not self.allow_unlike:
            raise UnlikeTargetsError(
                f"the targets differ in {'; '.join(d.line for d in likeness.differences)}; accepted: targets whose "
                "engines share these settings (the P/D split aside), or --allow-unlike to measure them and mark it")
        return likeness


def read_before_measuring(request: Any, model: Path | None) -> SettingsBook:
    """Every target's settings before anything starts: URL targets from what they show, configurations from their
    plan's flags (bench starts them later, one at a time); refused here when they differ. `request`: a
    BenchRequest (run.py)."""
    import httpx


    book = SettingsBook(allow_unlike=request.allow_unlike, gpus=request.gpus)
    with httpx.Client(timeout=30) as client:
        for t in request.targets:
            if t.target.url is not None:
                headers = auth_headers(request.api_key if t.role == "deployment" else None)
                book.read_url(client, t.role, t.target.url, run_root=request.run_root.resolve(), headers=headers,
                              name=request.served_model)
            else:
                topology = config_topology(t.target.config, model or default_model(), request.base_port,
                                           request.num_cores, t.target.fault, request.device, request.engine)
                book.read_plan(t.role, config_plan(t.target.config, topology, is_dry_run=True))
    book.check()
    return book


def parse_gpus(values: list[str] | None, roles: tuple[str, ...]) -> dict[str, int]:
    """--gpus N (every URL target) or ROLE=N, repeatable -> {role: N}."""
    out: dict[str, int] = {}
    for text in values or ():
        role, _, count = text.rpartition("=")
        if not count.isdigit() or int(count) < 1 or (role and role not in roles):
            raise InputError(f"--gpus {text}: accepted: a number of GPUs (1 or more) for every URL target, or "
                             f"ROLE=N with ROLE one of {', '.join(roles)}")
        out.update({r: int(count) for r in ((role,) if role else roles)})
    return out
