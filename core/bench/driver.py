"""Run one phase against one endpoint: requests as the load allows, probes beside them, every stream timed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from hybridserve.core.bench.phase import PhaseWork
from hybridserve.core.bench.stream import RequestRecord, stream_one
from hybridserve.core.common.errors import MissingExtraError
from hybridserve.core.common import keepalive

OnDone = Callable[[], None]


def run_phase(url: str, model: str, work: PhaseWork, prompts: tuple[tuple[int, ...], ...],
              probes: tuple[tuple[int, ...], ...], *, timeout_s: float, on_done: OnDone | None = None,
              transport=None, headers: dict[str, str] | None = None) -> tuple[RequestRecord, ...]:  # noqa: ANN001
    """The phase's records (requests in order, then probes); `on_done` after each answered request or probe.
    `transport` replaces the network for tests (httpx.MockTransport); None: real connections."""
    try:
        import httpx
    except ImportError:
        raise MissingExtraError("httpx", "cpu", "bench") from None
    return asyncio.run(_run(httpx, url, model, work, prompts, probes, timeout_s, on_done or (lambda: None),
                            transport, headers))


async def _run(httpx, url, model, work, prompts, probes, timeout_s, on_done, transport, headers):  # noqa: ANN001, ANN202
    load, probe = work.spec.load, work.spec.probe
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256,
                         keepalive_expiry=keepalive.IDLE_EXPIRY_S)
    slots = asyncio.Semaphore(load.max_concurrency) if load.max_concurrency else None
    probe_go = asyncio.Event()
    finished = [0]
    if probe is None or probe.after_requests == 0:
        probe_go.set()
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits, transport=transport,
                                 headers=headers) as client:
        start = time.perf_counter()

        async def one(i: int) -> RequestRecord:
            await asyncio.sleep(max(0.0, start + work.offsets_s[i] - time.perf_counter()))
            if slots is None:
                record = await stream_one(client, url, model, prompts[i], work.output_lens[i], phase_start=start)
            else:
                async with slots:
                    record = await stream_one(client, url, model, prompts[i], work.output_lens[i],
                                              phase_start=start)
            finished[0] += 1
            if probe is not None and finished[0] >= probe.after_requests:
                probe_go.set()
            on_done()
            return record

        async def probe_all() -> list[RequestRecord]:
            if probe is None:
                return []
            await probe_go.wait()
            out = []
            for prompt in probes:  # one after another: each probe meets the load, not the other probes
                out.append(await stream_one(client, url, model, prompt, probe.output_tokens, phase_start=start,
                                            is_probe=True))
                on_done()
            return out

        *records, probed = await asyncio.gather(*(one(i) for i in range(len(prompts))), probe_all())
    return tuple(records) + tuple(probed)
