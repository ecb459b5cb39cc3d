"""The Ray app of a plan as a KubeRay `RayService` (ray.io/v1): the same Serve config (serveConfigV2) on a Ray cluster
that KubeRay runs in pods.

- The head pod holds the ingress (the `hybridserve_ingress` unit): Serve's HTTP proxy listens there on 0.0.0.0 and
  KubeRay's serve Service sends clients to it. The front key is a Kubernetes Secret mounted into the head pod; the
  config names only the mounted file.
- One worker group per role, `replicas` = the topology's instances of that role, each pod offering one unit of its
  role's resource, so a prefill replica lands on a prefill pod (the topology's hosts become pods).
- The engine key is the cluster's token (authOptions mode token, KubeRay's Secret).
- Every pod runs `image`, which must hold Ray 2.60 with the ray extra of hybridserve installed (the plugin loads in
  every engine through vLLM's entry point) and the model at `model_source` (or a hub id it can download).

Pure: a dict. tests/test_rayserve_export.py checks it against KubeRay's RayService CRD schema.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

import yaml

from hybridserve.core.launch.launch_plan import LaunchPlan, Role
from hybridserve.core.launch.topology import Device
from hybridserve.core.rayserve.serve_config import INGRESS_RESOURCE, role_resource, set_startup_dir

RAY_VERSION = "2.60.0"
FRONT_KEY_DIR = "/etc/hybridserve/front-key"
FRONT_KEY_FILE = "key"  # the key inside the Secret: `kubectl create secret generic NAME --from-file=key=front.key`
SERVE_PORT = 8000
# hybridserve installed in rayproject/ray:2.60.0-py312's Python (pip install into /home/ray/anaconda3)
IMAGE_STARTUP_DIR = "/home/ray/anaconda3/lib/python3.12/site-packages/hybridserve/core/vllm_plugin/startup"
CORE_BOUND_ENV = ("VLLM_CPU_OMP_THREADS_BIND", "HYBRIDSERVE_CPU_CORES")


@dataclass(frozen=True, kw_only=True)
class KubeRayOptions:
    name: str = "hybridserve"
    image: str = f"rayproject/ray:{RAY_VERSION}-py312"  # a base to build from: add hybridserve[ray] and vLLM
    front_key_secret: str | None = None  # a Secret with the front key under FRONT_KEY_FILE; None: the door is open
    engine_key_secret: str | None = None  # a Secret with the cluster token (KubeRay authOptions); None: no token
    startup_dir: str = IMAGE_STARTUP_DIR  # hybridserve's core/vllm_plugin/startup folder inside the image


def rayservice(plan: LaunchPlan, serve: dict[str, Any], options: KubeRayOptions = KubeRayOptions()) -> dict[str, Any]:
    """`serve`: serve_config(plan) (with model_source where the pods find the model)."""
    config = copy.deepcopy(serve)
    config["http_options"] = {"host": "0.0.0.0", "port": SERVE_PORT}  # the pod's address: KubeRay's Service
    set_startup_dir(config, options.startup_dir)
    args = config["applications"][0]["args"]
    args["api_key_file"] = f"{FRONT_KEY_DIR}/{FRONT_KEY_FILE}" if options.front_key_secret else None
    for role in ("prefill_config", "decode_config"):  # a pod's cpuset is its binding: host core ids mean nothing
        env = args[role]["runtime_env"]["env_vars"]
        for name in CORE_BOUND_ENV:
            env.pop(name, None)
    spec: dict[str, Any] = {
        "rayVersion": RAY_VERSION,
        "headGroupSpec": {"rayStartParams": {"num-cpus": "8"}, "resources": {INGRESS_RESOURCE: "1"},
                          "template": _head_template(options)},
        "workerGroupSpecs": [_workers(plan, role, options) for role in (Role.PREFILL, Role.DECODE)],
    }
    if options.engine_key_secret:
        spec["authOptions"] = {"mode": "token", "secretName": options.engine_key_secret}
    return {"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": options.name},
            "spec": {"serveConfigV2": yaml.safe_dump(config, sort_keys=False), "rayClusterConfig": spec}}


def _head_template(options: KubeRayOptions) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "ray-head", "image": options.image,
        "ports": [{"containerPort": 6379, "name": "gcs-server"}, {"containerPort": 8265, "name": "dashboard"},
                  {"containerPort": SERVE_PORT, "name": "serve"}],
        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "4Gi"}},
    }
    pod: dict[str, Any] = {"containers": [container]}
    if options.front_key_secret:
        container["volumeMounts"] = [{"name": "front-key", "mountPath": FRONT_KEY_DIR, "readOnly": True}]
        pod["volumes"] = [{"name": "front-key", "secret": {"secretName": options.front_key_secret,
                                                           "defaultMode": 0o400}}]
    return {"spec": pod}


def _workers(plan: LaunchPlan, role: Role, options: KubeRayOptions) -> dict[str, Any]:
    commands = [c for c in plan.commands if c.role is role]
    inst = (plan.topology.prefill if role is Role.PREFILL else plan.topology.decode)[0]
    if plan.topology.device is Device.CUDA:
        limits = {"nvidia.com/gpu": str(inst.tp)}
        requests = {"cpu": str(2 * inst.tp)}
    else:
        cores = len(inst.devices) if inst.devices else inst.tp
        limits, requests = {}, {"cpu": str(max(cores, inst.tp))}
    container = {"name": f"ray-{role.value}", "image": options.image,
                 "resources": {"requests": requests, **({"limits": limits} if limits else {})}}
    count = len(commands)
    return {"groupName": role.value, "replicas": count, "minReplicas": count, "maxReplicas": count,
            "rayStartParams": {"num-cpus": "8"}, "resources": {role_resource(role.value): "1"},
            "template": {"spec": {"containers": [container]}}}


def manifest_text(manifest: dict[str, Any]) -> str:
    """YAML, with the Serve config as a block (kubectl apply -f)."""
    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return yaml.dump(manifest, Dumper=Dumper, sort_keys=False)


def to_json(manifest: dict[str, Any]) -> str:
    return json.dumps(manifest, indent=2)
