"""The Serve application that the Ray config's import_path names (serve_config.BUILDER): Ray Serve LLM's P/D graph,
ingress -> decode replica -> prefill replica, built with the project's replicas (servers.py) and front door.

Ray's own `build_pd_openai_app` fixes the decode class, so this builder calls Ray's pieces itself (the same calls
as ray 2.60's prefill_decode/builder.py). It runs wherever Serve builds the app (a task on the cluster), so it
imports nothing from the launch host: every value comes in the config's args. The front key file is named there and
read only by the ingress replica (auth.KeyFileGuard), which the config pins to the proxy's host.
"""

from __future__ import annotations

from typing import Any

from hybridserve.core.rayserve import shims  # noqa: F401 (first: before Ray's LLM modules import vLLM)

from ray import serve  # noqa: E402
from ray.llm._internal.common.dict_utils import maybe_apply_llm_deployment_config_defaults  # noqa: E402
from ray.llm._internal.serve.core.configs.openai_api_models import to_model_metadata  # noqa: E402
from ray.llm._internal.serve.core.ingress.ingress import init, make_fastapi_ingress  # noqa: E402
from ray.llm._internal.serve.core.server.builder import build_llm_deployment  # noqa: E402
from ray.llm._internal.serve.serving_patterns.prefill_decode.builder import PDServingArgs  # noqa: E402
from ray.serve.deployment import Application  # noqa: E402

from hybridserve.core.proxy.auth import KeyFileGuard  # noqa: E402
from hybridserve.core.rayserve.servers import HybridDecodeServer, HybridPrefillServer  # noqa: E402

OURS = ("first_token", "is_failover", "api_key_file")  # the args Ray's PDServingArgs does not know


def build_app(args: dict[str, Any]) -> Application:
    ours = {key: args.get(key) for key in OURS}
    pd = PDServingArgs.model_validate({k: v for k, v in args.items() if k not in OURS})
    prefill = build_llm_deployment(pd.prefill_config, name_prefix="Prefill:", deployment_cls=HybridPrefillServer)
    decode = build_llm_deployment(
        pd.decode_config, name_prefix="Decode:", deployment_cls=HybridDecodeServer,
        bind_kwargs={"prefill_server": prefill, "is_first_token": ours["first_token"] == "prefill",
                     "is_failover": bool(ours["is_failover"])})
    ingress_cls = pd.ingress_cls_config.ingress_cls
    options = maybe_apply_llm_deployment_config_defaults(ingress_cls.get_deployment_options([pd.decode_config]),
                                                         pd.ingress_deployment_config)
    fastapi_app = init()
    if ours["api_key_file"]:
        fastapi_app.add_middleware(KeyFileGuard, key_file=ours["api_key_file"])
    model_id = pd.decode_config.model_id
    return serve.deployment(make_fastapi_ingress(ingress_cls, app=fastapi_app), **options).bind(
        llm_deployments={model_id: decode}, model_cards={model_id: to_model_metadata(model_id, pd.decode_config)},
        lora_paths={}, **pd.ingress_cls_config.ingress_extra_kwargs)
