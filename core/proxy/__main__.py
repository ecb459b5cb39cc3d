"""`python -m hybridserve.core.proxy --prefill URL --decode URL [--host H --port P ...]`, or `--replica URL ...`
for aggregated serving: what launch starts."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hybridserve.core.common.errors import InputError
from hybridserve.core.launch.keys import read_key
from hybridserve.core.launch.topology import FirstTokenSource, RoutingPolicy
from hybridserve.core.proxy.config import ProxyConfig


def parse_args(argv: list[str] | None = None) -> tuple[ProxyConfig, str, int]:
    parser = argparse.ArgumentParser(prog="python -m hybridserve.core.proxy", description=__doc__)
    parser.add_argument("--prefill", action="append", default=[], help="prefill server URL (repeatable)")
    parser.add_argument("--decode", action="append", default=[], help="decode server URL (repeatable)")
    parser.add_argument("--replica", action="append", default=[],
                        help="aggregated serving: a plain server URL (repeatable), instead of prefill and decode")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--policy", default="round_robin", choices=[p.value for p in RoutingPolicy])
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per hop before the request fails")
    parser.add_argument("--model-name", default=None)
    parser.add_argument("--first-token", default="prefill", choices=[s.value for s in FirstTokenSource],
                        help="who samples a plain completion's first token (core/proxy/first_token.py)")
    parser.add_argument("--api-key-file", type=Path, default=None,
                        help="file with the key clients send (Authorization: Bearer); none: open to anyone")
    parser.add_argument("--engine-key-file", type=Path, default=None,
                        help="file with the key the engines ask for (their VLLM_API_KEY)")
    parser.add_argument("--health-interval", type=float, default=1.0,
                        help="seconds between probes of every server's /health (core/proxy/health_watch.py)")
    parser.add_argument("--warm-file", type=Path, default=None,
                        help="launch's warm file: a server it still warms up after a restart gets no requests")
    args = parser.parse_args(argv)
    is_pd, is_mixed = bool(args.prefill and args.decode), bool(args.replica and (args.prefill or args.decode))
    if is_mixed or not (is_pd or args.replica):
        parser.error("accepted: --prefill and --decode URLs (P/D), or --replica URLs (aggregated), not both")
    try:
        keys = {name: read_key(path, what=f"--{name.replace('_', '-')}-file") if path else None
                for name, path in (("api_key", args.api_key_file), ("engine_key", args.engine_key_file))}
    except InputError as exc:
        parser.error(str(exc))  # one line, exit 2; it names the file, never the key
    config = ProxyConfig(prefill_urls=tuple(args.prefill), decode_urls=tuple(args.decode),
                         replica_urls=tuple(args.replica),
                         policy=RoutingPolicy.parse(args.policy), timeout_s=args.timeout, model_name=args.model_name,
                         first_token=FirstTokenSource.parse(args.first_token),
                         health_interval_s=args.health_interval if args.health_interval > 0 else None,
                         warm_file=args.warm_file, **keys)
    return config, args.host, args.port


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    # lazy: `--help` and a refused argument answer without FastAPI, uvicorn and httpx
    from hybridserve.core.common import keepalive
    from hybridserve.core.proxy.app import create_app
    from hybridserve.core.proxy.server import ProxyServer

    config, host, port = parse_args(argv)
    app = create_app(config)
    # a client's request on an idle connection is read after a stall of the proxy's loop, not reset (keepalive.py)
    server = ProxyServer(uvicorn.Config(app, host=host, port=port, log_level="info", access_log=False,
                                        timeout_keep_alive=keepalive.server_idle_s(config.timeout_s)),
                         app.state.stopping)
    server.run()
    if not server.started:
        sys.exit(3)  # uvicorn.run's exit code when the server could not start (the port taken, say)


if __name__ == "__main__":
    main()
