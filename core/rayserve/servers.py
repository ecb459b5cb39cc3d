"""The prefill and decode replicas of the Ray app: Ray Serve LLM's P/D servers with what the project adds.

Both bind their engine to their node when they start: the NIXL side channel, UCX's and gloo's devices and vLLM's
own address take the Ray node's address (core/launch/bind_env.py), and the engine processes get the startup folder
that arms the torchvision shim (core/vllm_plugin/startup). The topology cannot say these per replica: Ray picks
the node.

The decode replica (Ray's PDDecodeServer orchestrates: it calls a prefill replica, then runs its own engine):
- first token from prefill (first_token.py, with the proxy's allowlist, eligibility.py): a plain completion gets
  token 1 when prefill answers; decode continues from prompt + token 1. Ray's stock path throws prefill's token
  away and decode computes it again.
- failover (failover.py's policy): a prefill hop that fails with a 5xx or a dead replica, before the client saw a
  byte, is tried once more (Serve routes it to a replica that is up), then decode computes the prompt itself.
  Ray's stock path returns the prefill error to the client.
"""

from __future__ import annotations

from hybridserve.core.rayserve import shims  # noqa: F401 (first: before Ray's LLM modules import vLLM)

import logging
import os
from typing import Any

import ray
from ray.llm._internal.serve.core.configs.openai_api_models import CompletionRequest, ErrorResponse
from ray.llm._internal.serve.core.server.llm_server import LLMServer
from ray.llm._internal.serve.serving_patterns.prefill_decode.pd_server import PDDecodeServer, PDPrefillServer

from hybridserve.core.common.contracts import BIND_HOST_ENV
from hybridserve.core.launch.bind_env import listener_env, network_device
from hybridserve.core.launch.engine_command import STARTUP_DIR
from hybridserve.core.proxy import eligibility, first_token
from hybridserve.core.rayserve import ray_first_token

logger = logging.getLogger("hybridserve.ray")
PREFILL_TRIES = 2  # the first hop and one retry; then decode alone (failover.MAX_FAILURES counts 3 over both roles)
RAY_OWNED = frozenset({"request_id"})  # set by Ray's server on the request, not by the client


def bind_to_node() -> str:
    """This replica's engine listens on one address only: the role's (HYBRIDSERVE_BIND_HOST) when this node holds
    it, else the Ray node's. Returns that address."""
    given = os.environ.get(BIND_HOST_ENV)
    address = given if given and network_device(given) is not None else ray.util.get_node_ip_address()
    os.environ.update(listener_env(address))
    os.environ["VLLM_NIXL_SIDE_CHANNEL_HOST"] = address
    paths = [STARTUP_DIR, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return address


class HybridPrefillServer(PDPrefillServer):
    async def __init__(self, llm_config, **kwargs: Any) -> None:  # noqa: ANN001 (ray's LLMConfig)
        logger.info("hybridserve prefill replica on %s", bind_to_node())
        await super().__init__(llm_config, **kwargs)


class HybridDecodeServer(PDDecodeServer):
    async def __init__(self, llm_config, *, prefill_server, is_first_token: bool = True,  # noqa: ANN001
                       is_failover: bool = True, **kwargs: Any) -> None:
        logger.info("hybridserve decode replica on %s (first token from %s, failover %s)", bind_to_node(),
                    "prefill" if is_first_token else "decode", "on" if is_failover else "off")
        self._is_first_token, self._is_failover = is_first_token, is_failover
        self._tokenizer = None
        self._two_hop_reasons: set[str] = set()
        await super().__init__(llm_config, prefill_server=prefill_server, **kwargs)

    async def completions(self, request: CompletionRequest, raw_request_info=None):  # noqa: ANN001, ANN201
        if self._is_first_token:
            body = {k: v for k, v in request.model_dump(exclude_unset=True).items() if k not in RAY_OWNED}
            way = eligibility.route(eligibility.FIRST_TOKEN_PATH, body)
            if way.is_first_token:
                return self._first_token_path(body, raw_request_info)
            self._note_two_hops(way)
        return await self._two_hops(request, raw_request_info, "completions")

    def _get_connector_backend(self):  # noqa: ANN202
        """Ray's NIXL backend, whose prefill request also drops min_tokens: Ray clamps prefill to max_tokens 1 and
        keeps the client's min_tokens, which vLLM refuses ("min_tokens must be less than or equal to max_tokens=1":
        every bench request, min_tokens 16, failed so on Ray's stock path). The proxy's hops.prefill_body drops it."""
        backend = super()._get_connector_backend()
        if not getattr(backend, "_hybridserve_min_tokens", False):
            prepare = backend.prepare_prefill_request

            def prepare_prefill_request(*, request, peer):  # noqa: ANN001, ANN202
                out = prepare(request=request, peer=peer)
                if getattr(out, "min_tokens", 0):
                    out.min_tokens = 0
                return out

            backend.prepare_prefill_request = prepare_prefill_request
            backend._hybridserve_min_tokens = True
        return backend

    def _note_two_hops(self, way: eligibility.Route) -> None:
        """One log line per reason a completion goes two hops (an unknown field: the proxy's allowlist has no row)."""
        reason = f"{way.reason} {','.join(way.unknown_fields)}".strip()
        if reason not in self._two_hop_reasons:
            self._two_hop_reasons.add(reason)
            logger.info("hybridserve decode: a completion goes two hops (%s); later ones for this reason too", reason)

    async def chat(self, request, raw_request_info=None):  # noqa: ANN001, ANN201
        return await self._two_hops(request, raw_request_info, "chat")

    async def _two_hops(self, request, raw_request_info, method: str):  # noqa: ANN001, ANN202
        """Ray's own orchestration; with failover, a 5xx or a dead replica before the first chunk is tried once
        more, then this replica serves the request alone."""
        if not self._is_failover:
            return self._pd_handle_request(request, raw_request_info)
        return self._with_failover(request, raw_request_info, method)

    async def _with_failover(self, request, raw_request_info, method: str):  # noqa: ANN001, ANN202
        for attempt in range(PREFILL_TRIES):
            gen = self._pd_handle_request(request.model_copy(deep=True), raw_request_info)
            try:
                first = await gen.__anext__()
            except StopAsyncIteration:
                return
            except Exception as exc:  # noqa: BLE001 (a dead replica: RayActorError, ActorDiedError, ...)
                logger.warning("hybridserve decode: P/D attempt %d failed: %s: %s", attempt + 1, type(exc).__name__,
                               str(exc)[:300])
                continue
            if _is_server_error(first):
                logger.warning("hybridserve decode: P/D attempt %d answered %s", attempt + 1, _error_line(first))
                continue
            yield first
            async for chunk in gen:
                yield chunk
            return
        logger.warning("hybridserve decode: serving request alone (no prefill answered)")
        alone = await getattr(LLMServer, method)(self, request, raw_request_info)
        async for chunk in alone:
            yield chunk

    async def _first_token_path(self, body: dict[str, Any], raw_request_info):  # noqa: ANN001, ANN202
        sent = first_token.prefill_body(body)
        answer = await self._prefill_answer(sent, raw_request_info)
        if answer is None:  # every prefill try failed: this replica alone, as failover.py's fallback
            async for chunk in await LLMServer.completions(self, CompletionRequest(**body), raw_request_info):
                yield chunk
            return
        if isinstance(answer, ErrorResponse):
            yield answer
            return
        first = first_token.FirstToken.parse("ray:prefill", sent, answer)
        first = await first_token.with_hidden_text(first, self._detokenize)
        if first.is_last:  # prefill's token ended the request: decode is not asked
            async for chunk in ray_first_token.alone(first, body):
                yield chunk
            return
        decoded = first_token.decode_body(body, first)
        local = await LLMServer.completions(self, CompletionRequest(**decoded), raw_request_info)
        if self._is_failover and not body.get("stream"):
            local = await self._or_alone(local, decoded, raw_request_info)
        # token 1 goes out before decode answers only when decode will take the length (first_token.fits)
        is_early = first_token.fits(first, body, self._llm_config.max_request_context_length)
        async for chunk in ray_first_token.joined(first, body, local, self._detokenize, is_early=is_early):
            yield chunk

    async def _or_alone(self, local, decoded: dict[str, Any], raw_request_info):  # noqa: ANN001, ANN202
        """Decode's answer; when it is a 5xx (the READ of prefill's blocks failed: a prefill that died after it
        answered), this replica computes prompt + token 1 itself, as failover.decode_step does without the blocks."""
        chunks = [chunk async for chunk in local]
        if not chunks or not _is_server_error(chunks[0]):
            return _replay(chunks)
        logger.warning("hybridserve decode: loading prefill's state failed (%s); computing the prompt here",
                       _error_line(chunks[0]))
        plain = {k: v for k, v in decoded.items() if k != "kv_transfer_params"}
        return await LLMServer.completions(self, CompletionRequest(**plain), raw_request_info)

    async def _prefill_answer(self, sent: dict[str, Any], raw_request_info) -> Any:  # noqa: ANN001, ANN401
        """Prefill's answer as a dict, an ErrorResponse for the client (a 4xx), or None: no prefill answered."""
        for attempt in range(PREFILL_TRIES if self._is_failover else 1):
            try:
                gen = self._prefill_handle.completions.remote(CompletionRequest(**sent), raw_request_info)
                chunk = await gen.__anext__()
                async for _ in gen:  # drained, as Ray's orchestrator does
                    pass
            except Exception as exc:  # noqa: BLE001
                logger.warning("hybridserve decode: prefill try %d failed: %s: %s", attempt + 1, type(exc).__name__,
                               str(exc)[:300])
                continue
            if isinstance(chunk, list):
                chunk = chunk[0]
            if _is_server_error(chunk):
                logger.warning("hybridserve decode: prefill try %d answered %s", attempt + 1, _error_line(chunk))
                continue
            return chunk if isinstance(chunk, ErrorResponse) else chunk.model_dump()
        if not self._is_failover:
            return ErrorResponse(error={"message": "prefill failed", "type": "InternalServerError", "code": 502})
        return None

    async def _detokenize(self, token_ids: list[int]) -> str:
        """vLLM's /detokenize: the ids' text with special tokens kept."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self._llm_config.model_loading_config.model_source)
        return self._tokenizer.decode(token_ids, skip_special_tokens=False)


async def _replay(chunks: list[Any]):  # noqa: ANN202
    for chunk in chunks:
        yield chunk


def _is_server_error(chunk: Any) -> bool:  # noqa: ANN401
    if isinstance(chunk, list) and chunk:
        chunk = chunk[0]
    return isinstance(chunk, ErrorResponse) and (chunk.error.code or 500) >= 500


def _error_line(chunk: Any) -> str:  # noqa: ANN401
    if isinstance(chunk, list):
        chunk = chunk[0]
    return f"{chunk.error.code}: {str(chunk.error.message)[:200]}"

