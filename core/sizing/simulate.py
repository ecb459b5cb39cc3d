"""A deployment simulated request by request: arrivals, the proxy's pick, each engine's steps (engine_sim.py), and for
P/D the hand-over: prefill computes the prompt and samples token 1 (launch's default, the first token from prefill,
core/proxy/first_token.py), the proxy's decode hop, decode's NIXL READ of the prompt's KV cache and GDN state
(priced by the layout's bytes and merged descriptors, step_profile.TransferCost), prefill's blocks held until that
READ is done, then decode's steps. What a client sees is each token `http_s` after the step that made it.

Pure Python, one event queue; a few hundred requests take well under a second.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from hybridserve.core.launch.topology import RoutingPolicy
from hybridserve.core.sizing.engine_sim import Engine, Job
from hybridserve.core.sizing.step_profile import EngineLimits, StepCoefficients


@dataclass(frozen=True, kw_only=True)
class EngineSpec:
    """What one engine of a role is: its step costs, limits and block pool."""

    coefficients: StepCoefficients
    limits: EngineLimits
    num_blocks: int
    blocks_for: Callable[[int], int]  # tokens held -> blocks (every group's, GDN state blocks included)


@dataclass(frozen=True, kw_only=True)
class SimDeployment:
    """Aggregated replicas (`replica` given) or xPyD (`prefill` and `decode` given)."""

    replica: EngineSpec | None = None
    num_replicas: int = 0
    prefill: EngineSpec | None = None
    num_prefill: int = 0
    decode: EngineSpec | None = None
    num_decode: int = 0
    transfer_s: Callable[[int], float] | None = None  # prompt tokens -> one request's READ, seconds
    http_s: float = 0.0
    policy: RoutingPolicy = RoutingPolicy.LEAST_OUTSTANDING

    @property
    def is_pd(self) -> bool:
        return self.replica is None


@dataclass(kw_only=True)
class SimRequest:
    rid: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    token_times: list[float] = field(default_factory=list)  # as the client sees them
    served_by: list[str] = field(default_factory=list)  # the engines it went to, in order

    @property
    def ttft_s(self) -> float:
        return self.token_times[0] - self.arrival_s

    @property
    def itls_s(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def end_s(self) -> float:
        return self.token_times[-1]


@dataclass(frozen=True, kw_only=True)
class SimResult:
    requests: tuple[SimRequest, ...]
    num_preemptions: int


class _Pool:
    def __init__(self, engines: list[Engine], policy: RoutingPolicy) -> None:
        self.engines, self.policy = engines, policy
        self.outstanding = {id(e): 0 for e in engines}
        self._cycle = itertools.cycle(engines)

    def pick(self) -> Engine:
        if self.policy is RoutingPolicy.LEAST_OUTSTANDING:
            return min(self.engines, key=lambda e: self.outstanding[id(e)])
        return next(self._cycle)


class _Cluster:
    def __init__(self, deployment: SimDeployment) -> None:
        self.d = deployment
        self.events: list = []
        self.counter = itertools.count()
        make = lambda spec, n, role: [Engine(f"{role}-{i}", spec.coefficients, spec.limits, spec.num_blocks,  # noqa: E731
                                             spec.blocks_for) for i in range(n)]
        if deployment.is_pd:
            self.front = _Pool(make(deployment.prefill, deployment.num_prefill, "prefill"), deployment.policy)
            self.back = _Pool(make(deployment.decode, deployment.num_decode, "decode"), deployment.policy)
            for engine in self.back.engines:
                engine.on_transfer = self._start_transfer
        else:
            self.front = _Pool(make(deployment.replica, deployment.num_replicas, "replica"), deployment.policy)
            self.back = None
        self.owner: dict[int, tuple[SimRequest, _Pool, Engine]] = {}  # id(job) -> its request, pool, engine
        self.prefill_job: dict[int, tuple[Job, Engine]] = {}  # rid -> its prefill job and engine, held until
        #                                                         decode's READ is done

    def at(self, time: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.events, (time, next(self.counter), action))

    def run(self, requests: list[SimRequest], max_concurrency: int | None = None) -> None:
        """Open loop (each request at its arrival time), or closed (`max_concurrency` in flight, the next sent when
        one finishes, as bench's --concurrency sends them)."""
        self.pending = list(reversed(requests)) if max_concurrency else []
        first = requests[:max_concurrency] if max_concurrency else requests
        if max_concurrency:
            del self.pending[len(self.pending) - len(first):]
        for request in first:
            self.at(request.arrival_s, lambda r=request: self._arrive(r))
        while self.events:
            now, _, action = heapq.heappop(self.events)
            self.now = now
            action()

    def _assign(self, pool: _Pool, request: SimRequest, job: Job) -> None:
        engine = pool.pick()
        request.served_by.append(engine.name)
        pool.outstanding[id(engine)] += 1
        self.owner[id(job)] = (request, pool, engine)
        engine.waiting.append(job)
        self._kick(engine)

    def _arrive(self, request: SimRequest) -> None:
        if self.d.is_pd:
            job = Job(rid=request.rid, prompt_tokens=request.prompt_tokens, max_new=1,
                      is_holding=request.output_tokens > 1)
        else:
            job = Job(rid=request.rid, prompt_tokens=request.prompt_tokens, max_new=request.output_tokens)
        self._assign(self.front, request, job)

    def _kick(self, engine: Engine) -> None:
        """Start the engine's next step once everything else due now has happened (requests that arrive together
        meet in one step, as they meet in vLLM's queue)."""
        if not engine.is_kicked:
            engine.is_kicked = True
            self.at(self.now, lambda: self._step(engine))

    def _step(self, engine: Engine) -> None:
        engine.is_kicked = False
        if engine.is_busy or not engine.has_work:
            return
        duration, batch = engine.schedule(self.now)
        if not batch:
            return
        engine.is_busy = True
        self.at(self.now + duration, lambda: self._step_done(engine, batch))

    def _step_done(self, engine: Engine, batch: list) -> None:
        engine.is_busy = False
        for job in engine.finish_step(self.now, batch):
            request, pool, _ = self.owner.pop(id(job))
            pool.outstanding[id(engine)] -= 1
            self._done(request, job, engine)
        for job, _, _ in batch:  # tokens of jobs still running
            if job.token_times and id(job) in self.owner:
                request = self.owner[id(job)][0]
                self._emit(request, job)
        self._kick(engine)

    def _emit(self, request: SimRequest, job: Job) -> None:
        """Tokens the job sampled since last time, as the client sees them."""
        while job.token_times:
            request.token_times.append(job.token_times.pop(0) + self.d.http_s)

    def _done(self, request: SimRequest, job: Job, engine: Engine) -> None:
        self._emit(request, job)
        if not job.is_holding and self.pending:  # the request is answered: a closed loop sends the next one
            nxt = self.pending.pop()
            nxt.arrival_s = self.now + self.d.http_s
            self.at(nxt.arrival_s, lambda: self._arrive(nxt))
        if self.d.is_pd and job.is_holding:  # prefill answered: the proxy's decode hop
            self.prefill_job[request.rid] = (job, engine)
            decode_job = Job(rid=request.rid, prompt_tokens=request.prompt_tokens + 1,
                             max_new=request.output_tokens - 1, remote_tokens=request.prompt_tokens)
            self.at(self.now + self.d.http_s, lambda: self._assign(self.back, request, decode_job))

    def _start_transfer(self, job: Job, now: float) -> None:
        engine = self.owner[id(job)][2]
        self.at(now + self.d.transfer_s(job.remote_tokens), lambda: self._transfer_done(engine, job))

    def _transfer_done(self, engine: Engine, job: Job) -> None:
        engine.loaded(job)
        held, prefill_engine = self.prefill_job.pop(job.rid)  # prefill frees the blocks once decode read them
        prefill_engine.release(held)
        self._kick(prefill_engine)
        self._kick(engine)


def simulate(deployment: SimDeployment, arrivals: list[tuple[float, int, int]], *,
             max_concurrency: int | None = None) -> SimResult:
    """`arrivals`: (arrival s, prompt tokens, output tokens) per request (workload.Workload.draw); with
    `max_concurrency`, a closed loop: the arrival times are ignored but the first ones' (0)."""
    cluster = _Cluster(deployment)
    requests = [SimRequest(rid=i, arrival_s=a, prompt_tokens=p, output_tokens=o)
                for i, (a, p, o) in enumerate(arrivals)]
    cluster.run(requests, max_concurrency)
    engines = cluster.front.engines + (cluster.back.engines if cluster.back else [])
    return SimResult(requests=tuple(requests), num_preemptions=sum(e.num_preemptions for e in engines))
