"""A deployment kind's load factor: how much longer its steps take under sustained load than the idle fit says.

Idle requests time the engine alone. Under load the rest of the host works too: on the 2-core CPU every API server,
the proxy and the client share the engines' cores, and P/D's engines run NIXL's progress beside their steps. A
closed-loop phase through the kind's proxy (every seat busy: `max_num_seqs` requests in flight per engine) is
measured with bench; the factor is the one by which the idle step costs must be multiplied for the simulation of
that same phase (same requests, same concurrency) to take the measured wall time (bisection: the wall time grows
with the factor). Stored per kind in the profile (`load_factors`), and applied by plan to candidates of that kind.
"""

from __future__ import annotations

from hybridserve.core.launch.topology import RoutingPolicy
from hybridserve.core.sizing.candidates import Candidate, EngineBuilder
from hybridserve.core.sizing.simulate import simulate

LOW, HIGH, STEPS = 0.2, 50.0, 30


def simulated_wall_s(builder: EngineBuilder, candidate: Candidate, requests: list[tuple[int, int]],
                     concurrency: int, load_factor: float) -> float:
    deployment = builder.deployment(candidate, RoutingPolicy.LEAST_OUTSTANDING, load_factor=load_factor)
    result = simulate(deployment, [(0.0, p, o) for p, o in requests], max_concurrency=concurrency)
    return max(r.end_s for r in result.requests) - min(r.arrival_s for r in result.requests)


def load_factor(builder: EngineBuilder, candidate: Candidate, requests: list[tuple[int, int]], concurrency: int,
                measured_wall_s: float) -> float:
    """The factor whose simulation of the phase takes `measured_wall_s` (clamped to [LOW, HIGH])."""
    low, high = LOW, HIGH
    if simulated_wall_s(builder, candidate, requests, concurrency, high) < measured_wall_s:
        return high
    if simulated_wall_s(builder, candidate, requests, concurrency, low) > measured_wall_s:
        return low
    for _ in range(STEPS):
        middle = (low * high) ** 0.5
        low, high = (middle, high) if simulated_wall_s(builder, candidate, requests, concurrency,
                                                       middle) < measured_wall_s else (low, middle)
        if high / low < 1.005:
            break
    return round((low * high) ** 0.5, 4)
