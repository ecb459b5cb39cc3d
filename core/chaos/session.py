"""One chaos run: `launch --restart on-failure` as a user starts it (a topology with one prefill and one or two
decode instances), a bounded load through its front door, then for each kill: SIGKILL the roles' process groups,
keep the load on for `load_s`, pause it, wait for launch to bring them back and, where prefill survived, for its KV
usage to be back at idle (vLLM frees blocks no decode read at the end of the lease, kv_lease_s); then resume. Every
OK answer is judged against prefill's own greedy answer to its prompt, asked before the first kill (reference.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import yaml

from hybridserve.core.chaos.bounded_load import KvSampler, Load
from hybridserve.core.chaos.reference import prompt_pool, references
from hybridserve.core.chaos.tally import Kill, KillRow, held_seconds, released_seconds, tally, verdicts
from hybridserve.core.chaos.timeline_gaps import read_events as read_timeline
from hybridserve.core.common.contracts import RELEASED_EVENT, RESTART_LOG, TIMELINE_FILE_ENV
from hybridserve.core.deployments.target import default_model
from hybridserve.core.supervise.guard import wait_groups_gone
from hybridserve.core.supervise.health import health_status
from hybridserve.core.supervise.role_watch import read_events
from hybridserve.core.validate.thresholds import Thresholds

LAUNCH = [sys.executable, "-c", "from hybridserve.cli.app import main; main()", "launch"]
SERVED_AGAIN_S = 30.0  # how long a restarted engine has to complete a request once the load resumes
HEALTH_AFTER_S = 2.0  # the front end's /health is read this long after each kill (the proxy probes every second)
_SUCCESS = re.compile(r"^vllm:request_success_total\{[^}]*\} ([0-9.eE+]+)$", re.M)


@dataclass(frozen=True, kw_only=True)
class ChaosSpec:
    kills: tuple[tuple[tuple[float, str], ...], ...]  # phases; each: (seconds after the phase's first kill, role)
    num_decodes: int = 2
    router: str = "hybridserve"
    base_port: int = 19600
    model: Path | None = None  # None: the trained recall model (validate's default), else launch's tiny model
    device: str = "cpu"
    engine: dict = field(default_factory=dict)  # topology `engine:` keys (max_model_len, enforce_eager, ...)
    num_clients: int = 3
    max_tokens: int = 24
    load_s: float = 10.0  # load after a phase's last kill, before the pause
    steady_s: float = 5.0  # load before each phase
    kv_lease_s: int = 30
    start_timeout_s: float = 420.0
    keep_logs: Path | None = None  # where the run folder's logs, restart events and launch's output are copied
    num_prompts: int = 8  # the load's prompt pool (reference.py)
    env: dict = field(default_factory=dict)  # more environment for every engine instance (topology `env`)
    thresholds: Thresholds = field(default_factory=Thresholds)  # the floor of the judging limits (reference.py)


@dataclass(frozen=True, kw_only=True)
class ChaosResult:
    rows: list[KillRow]
    kv_held: dict[str, dict[str, float | None]]  # kill -> surviving engine -> seconds until its KV usage was idle
    served_again: dict[str, int]  # restarted engine -> requests it completed after its restart (a fresh count)
    left_running: list[int]  # process groups of the run still alive after launch stopped
    launch_exit: int | None
    kv_samples: list[tuple[float, str, float | None]]
    restarts: list[dict]
    front_health: dict[str, object]  # kill (row label) -> the front end's /health HEALTH_AFTER_S after it
    failures: list[dict]  # every failed request as the client saw it, with its proxy events
    kills: list[dict]  # when each kill was (time.time()) and its row label
    # prefill kill (row label) -> seconds from it to each decode's release of the dead engine's NIXL state
    peer_released: dict[str, list[float]] = field(default_factory=dict)
    error: str | None = None  # why the run stopped before its last phase: the rows hold what was measured until then
    wrong: list[dict] = field(default_factory=list)  # every OK answer judged wrong: request, prompt, why
    judging: dict = field(default_factory=dict)  # the thresholds the answers were judged with and the noise behind them


@dataclass
class _SoFar:
    """What the phases measured so far: a run that stops in a phase still reports the phases before it."""

    kills: list[Kill] = field(default_factory=list)
    kv_held: dict[str, dict[str, float | None]] = field(default_factory=dict)  # phase -> survivor -> s idle after
    served_again: dict[str, int] = field(default_factory=dict)
    down_seen: dict[str, object] = field(default_factory=dict)
    references: list = field(default_factory=list)  # prefill's answer to each pool prompt
    thresholds: Thresholds | None = None
    judging: dict = field(default_factory=dict)


def parse_phase(text: str) -> tuple[tuple[float, str], ...]:
    """'decode-0,decode-1@5' -> ((0, decode-0), (5, decode-1))."""
    out = []
    for part in text.split(","):
        role, _, offset = part.partition("@")
        out.append((float(offset or 0), role.strip()))
    return tuple(out)


def topology_yaml(spec: ChaosSpec) -> str:
    b, cores = spec.base_port, max(1, os.cpu_count() or 1)
    last = cores - 1 if spec.device == "cpu" else 0
    engine = {"kv_lease_s": spec.kv_lease_s, **spec.engine}
    decodes = [{"port": b + 200 + i, "side_channel_port": b + 250 + i, "devices": [last], "env": spec.env}
               for i in range(spec.num_decodes)]
    proxy = {"port": b, "timeout_s": 60, **({"kind": "vllm-router", "metrics_port": b + 50}
                                            if spec.router == "vllm-router" else {})}
    return json.dumps({"model": str(_model(spec)), "device": spec.device, "engine": engine,
                       "prefill": [{"port": b + 100, "side_channel_port": b + 150, "devices": [0], "env": spec.env}],
                       "decode": decodes, "proxy": proxy})  # JSON is YAML


def run_chaos(spec: ChaosSpec, *, on_phase: Callable[[str], None] | None = None) -> ChaosResult:
    note = on_phase or (lambda _m: None)
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "topology.yaml").write_text(topology_yaml(spec))
        launcher = None
        try:
            launcher, run_dir, endpoints = _launch(tmp_path, spec)
            engines = {name: url for name, url in endpoints.items() if name != "proxy"}
            load = Load(endpoints["proxy"], _model_name(spec), prompt_pool(spec.num_prompts),
                        num_clients=spec.num_clients, max_tokens=spec.max_tokens)
            sampler = KvSampler(engines).start()
            load.start()
            so_far, error = _SoFar(), None
            try:
                _phases(spec, run_dir, endpoints, engines, load, sampler, so_far, note)
            except (RuntimeError, OSError, httpx.HTTPError) as exc:  # a role that never came back, say
                error = f"{type(exc).__name__}: {exc}"
            return _finish(launcher, run_dir, tmp_path, load, sampler, so_far, error)
        finally:
            stop_launcher(launcher)
            for run_dir in (tmp_path / "runs").glob("*/"):  # launch's own, even where it never reported it
                kill_groups(run_dir)
                if spec.keep_logs is not None:
                    _keep_logs(tmp_path, run_dir, spec.keep_logs)


def _launch(tmp: Path, spec: ChaosSpec) -> tuple[subprocess.Popen, Path, dict[str, str]]:
    return start_launch(tmp, timeout_s=spec.start_timeout_s)


def start_launch(tmp: Path, *, timeout_s: float,
                 restart: str = "on-failure") -> tuple[subprocess.Popen, Path, dict[str, str]]:
    """launch --role all of `tmp`/topology.yaml in its own session, as a user starts it, the timeline on
    (`tmp`/timeline.jsonl); its run folder and endpoints once it reports them (it is SIGKILLed, with its group, when
    it does not)."""
    env = {**os.environ, TIMELINE_FILE_ENV: str(tmp / "timeline.jsonl")}
    out, err = open(tmp / "launch.out", "w+"), open(tmp / "launch.err", "w+")
    launcher = subprocess.Popen([*LAUNCH, "--topology", str(tmp / "topology.yaml"), "--role", "all", "--json",
                                 "--run-dir", str(tmp / "runs"), "--timeout", str(timeout_s),
                                 "--restart", restart], stdout=out, stderr=err, env=env, start_new_session=True)
    deadline = time.monotonic() + report_wait_s(tmp / "topology.yaml", timeout_s)
    while time.monotonic() < deadline:
        text = (tmp / "launch.out").read_text()
        if text.strip().endswith("}"):
            info = json.loads(text)
            return launcher, Path(info["run_dir"]), info["endpoints"]
        if launcher.poll() is not None:
            raise RuntimeError(f"launch exited {launcher.returncode}: {(tmp / 'launch.err').read_text()[-2000:]}")
        time.sleep(1)
    stop_launcher(launcher)
    raise RuntimeError("launch did not report its endpoints in time")


def report_wait_s(topology: Path, timeout_s: float) -> float:
    """How long to wait for launch's endpoints: its --timeout bounds each start wave, and engines sharing a GPU start
    one wave after another (core/launch/gpu_shares.start_waves), so at most one wave per engine, plus a minute for the
    front. A cold 60-layer start of one prefill and two decodes on one H200 took three waves of 118-166 s
    (2026-12-05), past a wait of one --timeout."""
    topo = yaml.safe_load(topology.read_text()) or {}
    engines = sum(len(topo.get(role) or []) for role in ("prefill", "decode", "replicas"))
    return timeout_s * max(1, engines) + 60


def stop_launcher(launcher: subprocess.Popen | None) -> None:
    if launcher is not None and launcher.poll() is None:
        with _suppress():
            os.killpg(launcher.pid, signal.SIGKILL)


def _phases(spec: ChaosSpec, run_dir: Path, endpoints: dict[str, str], engines: dict[str, str], load: Load,
            sampler: KvSampler, so_far: _SoFar, note: Callable[[str], None]) -> None:
    _wait_first_ok(load, timeout_s=spec.start_timeout_s)  # the first P/D request also makes the NIXL handshake
    _wait_all_up(endpoints, timeout_s=spec.start_timeout_s)
    note("asking prefill for the reference answers")
    answers, thresholds, noise = references(endpoints["prefill-0"], [load.body(i) for i in range(len(load.prompts))],
                                            spec.thresholds)
    so_far.references, so_far.thresholds = answers, thresholds
    so_far.judging = {"thresholds": asdict(thresholds), "noise": asdict(noise), "reference": "prefill-0"}
    for number, phase in enumerate(spec.kills, start=1):
        _wait_all_up(endpoints, timeout_s=spec.start_timeout_s)
        time.sleep(spec.steady_s)
        note(f"killing {', '.join(r for _, r in phase)}")
        phase_kills = _kill_phase(phase, number, run_dir, endpoints, so_far.down_seen)
        so_far.kills += phase_kills
        label = _phase_label(phase_kills)
        time.sleep(max(0.0, spec.load_s - HEALTH_AFTER_S))
        load.pause()
        victims = {r for k in phase_kills for r in k.roles}
        so_far.kv_held[label] = _wait_back(spec, phase_kills, victims, engines, run_dir, sampler)
        load.resume()
        so_far.served_again.update(_served_again(victims, engines, timeout_s=SERVED_AGAIN_S))


def _finish(launcher: subprocess.Popen, run_dir: Path, tmp: Path, load: Load, sampler: KvSampler, so_far: _SoFar,
            error: str | None) -> ChaosResult:
    """Stop the load and launch (SIGTERM, as an operator does), then count what the client saw."""
    sent = load.stop()
    samples = sampler.stop()
    launcher.send_signal(signal.SIGTERM)
    try:
        code = launcher.wait(timeout=90)
    except subprocess.TimeoutExpired:
        code = None
    left = wait_groups_gone(_run_groups(run_dir), timeout_s=10)
    restarts = read_events(run_dir)
    timeline_path = tmp / "timeline.jsonl"
    events = read_timeline(timeline_path) if timeline_path.is_file() else []
    failed = [s for s in sent if not s.is_ok and not s.is_refused]
    proxy_lines = _lines_naming({s.rid for s in failed}, run_dir / "proxy.log")
    failures = [asdict(s) | {"events": [e for e in events if e.get("req") == s.rid and e.get("pid") is not None
                                        and e["event"] in ("retry", "fallback", "hop1_start", "hop2_start")],
                             "proxy_log": proxy_lines.get(s.rid, [])}
                for s in failed]
    judged = verdicts(sent, so_far.references, so_far.thresholds) if so_far.thresholds is not None else {}
    wrong = [{"rid": s.rid, "prompt_index": s.prompt_index, "is_stream": s.is_stream, "end": s.end,
              "why": judged[s.rid], "text": s.answer.text if s.answer else None} for s in sent if judged.get(s.rid)]
    return ChaosResult(rows=tally(sent, so_far.kills, events, restarts, judged), kv_held=so_far.kv_held,
                       served_again=so_far.served_again, left_running=left, launch_exit=code, kv_samples=samples,
                       restarts=restarts, front_health=so_far.down_seen, failures=failures,
                       kills=[{"t": k.t, "label": k.label} for k in so_far.kills],
                       peer_released=released_seconds(so_far.kills, events, RELEASED_EVENT), error=error,
                       wrong=wrong, judging=so_far.judging)


def _lines_naming(rids: set[str], log: Path, *, most: int = 10) -> dict[str, list[str]]:
    """The proxy log's lines about each failed request (its failures, retries and fallbacks name the request id)."""
    found: dict[str, list[str]] = {}
    if not rids or not log.is_file():
        return found
    for line in log.read_text(errors="replace").splitlines():
        for rid in rids:
            if rid in line and len(found.setdefault(rid, [])) < most:
                found[rid].append(line.strip()[:500])
    return found


def _keep_logs(tmp: Path, run_dir: Path, to: Path, *, tail_bytes: int = 200_000) -> None:
    """The last `tail_bytes` of each role's log (its /health lines left out), the restart events and launch's own
    output, into `to`: the run folder goes with the temporary one."""
    to.mkdir(parents=True, exist_ok=True)
    for path in [*run_dir.glob("*.log"), run_dir / RESTART_LOG, tmp / "launch.out", tmp / "launch.err"]:
        if path.is_file():
            text = "".join(line for line in path.read_text(errors="replace").splitlines(keepends=True)
                           if "GET /health" not in line)
            (to / path.name).write_text(text[-tail_bytes:])


def _phase_label(kills: list[Kill]) -> str:
    return f"{kills[0].phase} {'+'.join(r for k in kills for r in k.roles)}"


def _kill_phase(phase: tuple[tuple[float, str], ...], number: int, run_dir: Path, endpoints: dict[str, str],
                health: dict[str, object]) -> list[Kill]:
    """SIGKILL each role of the phase at its offset; the front end's /health HEALTH_AFTER_S after each kill (before
    the next one) goes into `health` under the kill's row label."""
    start, out, dead = time.time(), [], set()
    for offset, role in sorted(phase):
        time.sleep(max(0.0, start + offset - time.time()))
        dead.add(role)
        alive = tuple(n for n in endpoints if n.startswith("decode-") and n not in dead)
        with _suppress():
            os.killpg(int((run_dir / f"{role}.pid").read_text()), signal.SIGKILL)
        out.append(Kill(t=time.time(), roles=(role,), alive_decodes=alive, phase=number))
        time.sleep(HEALTH_AFTER_S)
        health[out[-1].label] = _front_health(endpoints["proxy"])
    return out


def _wait_back(spec: ChaosSpec, kills: list[Kill], victims: set[str], engines: dict[str, str], run_dir: Path,
               sampler: KvSampler) -> dict[str, float | None]:
    """Until every victim is serving again and each surviving engine's KV usage is idle (or the lease + 10 s);
    then the seconds from the phase's last kill until each survivor's usage was idle for good."""
    first, last = kills[0].t, kills[-1].t
    deadline = max(time.time() + spec.start_timeout_s, first + spec.kv_lease_s + 10)
    survivors = [n for n in engines if n not in victims]
    is_lease = any(k.is_decode for k in kills)  # prefill may hold blocks no decode will read: wait for the lease
    while time.time() < deadline:
        back = all(any(e["role"] == v and e["event"] == "serving" and e["t"] > first for e in read_events(run_dir))
                   for v in victims)
        idle = (not is_lease or all((sampler.latest(n) or 0.0) <= 0.0 for n in survivors)
                or time.time() > last + spec.kv_lease_s + 10)
        if back and idle:
            break
        time.sleep(0.5)
    return {n: held_seconds(sampler.samples, n, last) for n in survivors}


def _served_again(victims: set[str], engines: dict[str, str], *, timeout_s: float) -> dict[str, int]:
    """Requests each restarted engine completed since its restart (a fresh process counts from 0), once each has
    completed one or `timeout_s` passed: the front end routes to it again."""
    deadline = time.monotonic() + timeout_s
    while True:
        counts = {name: _successes(engines[name]) for name in victims if name in engines}
        if all(counts.values()) or time.monotonic() > deadline:
            return counts
        time.sleep(0.5)


def _wait_first_ok(load: Load, *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(s.is_ok for s in load.sent) and time.monotonic() < deadline:
        time.sleep(0.2)


def _wait_all_up(endpoints: dict[str, str], *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        statuses = {n: health_status(u, timeout_s=5) for n, u in endpoints.items()}
        if all(s == 200 if n != "proxy" else s is not None for n, s in statuses.items()):
            return
        time.sleep(0.5)
    raise RuntimeError(f"roles not healthy after {timeout_s:.0f} s: {statuses}")


def _front_health(url: str) -> object:
    try:
        response = httpx.get(f"{url}/health", timeout=5)
    except httpx.HTTPError as exc:
        return {"status": None, "error": type(exc).__name__}
    try:
        body = response.json()
    except ValueError:
        body = response.text[:200]
    return {"status": response.status_code, "body": body}


def _successes(url: str) -> int:
    try:
        text = httpx.get(f"{url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return 0
    return int(sum(float(v) for v in _SUCCESS.findall(text)))


def _model(spec: ChaosSpec) -> Path:
    return (spec.model or default_model()).resolve()


def _model_name(spec: ChaosSpec) -> str:
    return _model(spec).name


def _run_groups(run_dir: Path) -> list[int]:
    return [int(p.read_text()) for p in run_dir.glob("*.pid") if p.read_text().strip().isdigit()]


def kill_groups(run_dir: Path) -> None:
    for pgid in _run_groups(run_dir):
        with _suppress():
            os.killpg(pgid, signal.SIGKILL)


def _suppress():  # noqa: ANN202
    import contextlib

    return contextlib.suppress(ProcessLookupError, PermissionError, ValueError, FileNotFoundError)
