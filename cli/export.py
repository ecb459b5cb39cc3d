"""`hybridserve export ray|kuberay`: the launch plan as a Ray Serve config, or as a KubeRay RayService manifest."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer
import yaml

from hybridserve.cli.console import err_console, out_console
from hybridserve.cli.help import HelpCommand, HelpGroup
from hybridserve.core.common import atomic_file
from hybridserve.core.launch.launch_plan import LaunchPlan, Role
from hybridserve.core.launch.request import LaunchRequest, prepare_launch
from hybridserve.core.launch.topology import Device, FirstTokenSource

app = typer.Typer(cls=HelpGroup, no_args_is_help=True, help="Write the deployment for a cluster engine (docs/ray.md).")

TopologyOpt = Annotated[Optional[Path], typer.Option(help="Topology YAML (default: one P and one D, this machine).")]
ModelOpt = Annotated[Optional[Path], typer.Option("--model", "-m", help="Model folder (default: the shipped tiny "
                                                  "Qwen3.5).")]
DeviceOpt = Annotated[str, typer.Option(help="cpu or cuda.")]
SourceOpt = Annotated[Optional[str], typer.Option(help="Where the Ray nodes find the model (a path there or a hub "
                                                  "id); default: the model folder's path here.")]
VllmOpt = Annotated[Optional[str], typer.Option(help="The nodes' vLLM (0.26, 0.32); default: the installed one.")]
FirstOpt = Annotated[str, typer.Option(help="Who samples token 1: prefill (the project's) or decode (Ray's).")]
FailoverOpt = Annotated[bool, typer.Option(help="A failed prefill is retried once, then decode computes the prompt.")]
OutOpt = Annotated[Optional[Path], typer.Option("--out", "-o", help="Write here (default: stdout).")]


def _plan(topology: Path | None, model: Path | None, device: str, vllm: str | None, first: str,
          api_key_file: Path | None = None) -> LaunchPlan:
    return prepare_launch(LaunchRequest(role=Role.ALL, model=model, topology_file=topology, device=Device.parse(device),
                                        num_cores=os.cpu_count() or 1, num_gpus=1, vllm_version=vllm, is_dry_run=True,
                                        first_token=FirstTokenSource.parse(first), api_key_file=api_key_file))


def _write(text: str, out: Path | None) -> None:
    if out is None:
        out_console.print(text, highlight=False, markup=False, soft_wrap=True, end="")
        return
    atomic_file.write_text(out, text)
    err_console.print(f"wrote {out}", highlight=False)


@app.command("ray", cls=HelpCommand)
def ray_command(topology: TopologyOpt = None, model: ModelOpt = None, device: DeviceOpt = "cpu",
                model_source: SourceOpt = None, vllm_version: VllmOpt = None, first_token: FirstOpt = "prefill",
                failover: FailoverOpt = True,
                api_key_file: Annotated[Optional[Path], typer.Option(help="Front key file, as the ingress's host "
                                                                     "reads it.")] = None,
                out: OutOpt = None) -> None:
    """The Ray Serve config of the plan (what `launch --engine ray` deploys), for `serve deploy`.

    Examples:

      hybridserve export ray -o serve.yaml && serve deploy serve.yaml

      hybridserve export ray --topology t.yaml --device cuda --vllm-version 0.26 --model-source /models/q
    """
    from hybridserve.core.rayserve.serve_config import RayOptions, serve_config

    plan = _plan(topology, model, device, vllm_version, first_token, api_key_file)
    config = serve_config(plan, RayOptions(is_failover=failover, model_source=model_source))
    _write(yaml.safe_dump(config, sort_keys=False), out)


@app.command("kuberay", cls=HelpCommand)
def kuberay_command(topology: TopologyOpt = None, model: ModelOpt = None, device: DeviceOpt = "cpu",
                    model_source: SourceOpt = None, vllm_version: VllmOpt = None, first_token: FirstOpt = "prefill",
                    failover: FailoverOpt = True,
                    image: Annotated[str, typer.Option(help="Every pod's image: Ray 2.60 + hybridserve[ray] + "
                                                       "vLLM + the model.")] = "rayproject/ray:2.60.0-py312",
                    name: Annotated[str, typer.Option(help="The RayService's name.")] = "hybridserve",
                    front_key_secret: Annotated[Optional[str], typer.Option(
                        help="Secret holding the front key under 'key' (mounted in the head pod).")] = None,
                    engine_key_secret: Annotated[Optional[str], typer.Option(
                        help="Secret holding the cluster token (KubeRay authOptions, mode token).")] = None,
                    startup_dir: Annotated[Optional[str], typer.Option(
                        help="hybridserve's core/vllm_plugin/startup folder in the image (default: where pip puts "
                             "it in rayproject/ray's Python 3.12).")] = None,
                    out: OutOpt = None) -> None:
    """A KubeRay RayService (ray.io/v1) running the same Serve config: kubectl apply -f the file.

    Examples:

      hybridserve export kuberay --device cuda --vllm-version 0.26 --model-source /models/qwen3.5 \\
          --image registry.example/hybridserve:1 --front-key-secret hs-front -o rayservice.yaml
    """
    from hybridserve.core.rayserve.kuberay import KubeRayOptions, manifest_text, rayservice
    from hybridserve.core.rayserve.serve_config import RayOptions, serve_config

    plan = _plan(topology, model, device, vllm_version, first_token)
    config = serve_config(plan, RayOptions(is_failover=failover, model_source=model_source))
    options = KubeRayOptions(name=name, image=image, front_key_secret=front_key_secret,
                             engine_key_secret=engine_key_secret)
    manifest = rayservice(plan, config, replace(options, startup_dir=startup_dir) if startup_dir else options)
    _write(manifest_text(manifest), out)
