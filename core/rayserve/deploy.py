"""Deploy a Serve config (serve_config.py) on a Ray cluster, wait until it serves, take it down again.

The same calls as `serve run CONFIG` (ray/serve/scripts.py): a driver joins the cluster in Serve's namespace,
starts Serve with the config's HTTP options and submits the applications. Taking down: the application is deleted
on a cluster launch was given (--ray-address; other applications there are left alone); on a head launch started
itself Serve is shut down and the node stopped (cluster.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridserve.core.common.errors import CouldNotRunError
from hybridserve.core.rayserve.ray_node import auth_env
from hybridserve.core.rayserve.serve_config import APP_NAME

SERVE_NAMESPACE = "serve"  # ray.serve._private.constants.SERVE_NAMESPACE


@dataclass(frozen=True)
class Status:
    app: str  # Serve's application status: DEPLOYING, RUNNING, DEPLOY_FAILED, UNHEALTHY, ...
    message: str
    deployments: dict[str, str]  # deployment name -> its status (HEALTHY, UPDATING, UNHEALTHY, ...)


def connect(address: str, token_file: Path | None = None) -> None:
    """Join as a driver. The token's variables must be set before `ray` is first imported in this process (it reads
    the auth mode once): launch_ray sets them first; here they are set for a caller that had not imported ray."""
    os.environ.update(auth_env(token_file))
    import ray

    deadline = time.monotonic() + 60
    while True:
        try:
            ray.init(address=address, namespace=SERVE_NAMESPACE, logging_level="warning", log_to_driver=False)
            return
        except (ConnectionError, RuntimeError) as exc:
            if time.monotonic() > deadline:
                raise CouldNotRunError(f"--ray-address {address}: cannot join the cluster ({exc})") from None
            time.sleep(1)


def submit(config: dict[str, Any]) -> None:
    from ray.serve._private import api as serve_api
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(config)
    client = serve_api.serve_start(http_options=schema.http_options.model_dump(),
                                   proxy_location=schema.proxy_location)
    client.deploy_apps(schema, _blocking=False)


def status() -> Status:
    from ray import serve

    app = serve.status().applications.get(APP_NAME)
    if app is None:
        return Status("NOT_STARTED", "", {})
    deployments = {name: d.status.value for name, d in app.deployments.items()}
    messages = [f"{name}: {d.message.strip()}" for name, d in app.deployments.items() if d.message]
    return Status(app.status.value, " | ".join([app.message or "", *messages]).strip(" |"), deployments)


def wait_running(timeout_s: float, on_progress: Callable[[Status], None] | None = None) -> Status:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = status()
        if on_progress is not None:
            on_progress(now)
        if now.app == "RUNNING":
            return now
        if now.app == "DEPLOY_FAILED":
            raise CouldNotRunError(f"Ray Serve could not deploy {APP_NAME}: {now.message.strip()[-1500:]}")
        time.sleep(2)
    raise CouldNotRunError(f"Ray Serve's {APP_NAME} is not RUNNING after {timeout_s:.0f} s: {status()}")


def take_down(*, is_own_cluster: bool) -> None:
    import ray
    from ray import serve

    try:
        if is_own_cluster:
            serve.shutdown()
        else:
            serve.delete(APP_NAME)
    finally:
        ray.shutdown()
