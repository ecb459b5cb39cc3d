"""`hybridserve export kuberay` writes a RayService that KubeRay's CRD schema accepts (tests/data/kuberay), holding the
same Serve config as `launch --engine ray`; `export ray` and `launch --engine ray --dry-run` print that config."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from hybridserve.cli.app import app
from hybridserve.core.launch.launch_plan import Role, make_launch_plan
from hybridserve.core.launch.topology import local_topology
from hybridserve.core.rayserve.kuberay import FRONT_KEY_DIR, KubeRayOptions, manifest_text, rayservice
from hybridserve.core.rayserve.serve_config import serve_config

jsonschema = pytest.importorskip("jsonschema")
SCHEMA = json.loads(gzip.decompress((Path(__file__).parent / "data/kuberay/rayservice-v1.schema.json.gz").read_bytes()))


def _manifest(**options) -> dict:  # noqa: ANN003
    plan = make_launch_plan(local_topology(), Role.ALL)
    return rayservice(plan, serve_config(plan), KubeRayOptions(**options))


def _errors(manifest: dict) -> list[str]:
    validator = jsonschema.Draft7Validator(SCHEMA)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(manifest)]


@pytest.mark.parametrize("options", [{}, {"front_key_secret": "hs-front", "engine_key_secret": "hs-token"}],
                         ids=["open", "keys"])
def test_the_manifest_passes_the_crd_schema(options):
    manifest = yaml.safe_load(manifest_text(_manifest(**options)))  # what kubectl reads
    assert _errors(manifest) == []


@pytest.mark.parametrize("breakage, where", [
    (lambda m: m["spec"]["rayClusterConfig"]["workerGroupSpecs"][0].pop("template"), "template"),
    (lambda m: m["spec"]["rayClusterConfig"].update(authOptions={"mode": "password"}), "authOptions/mode"),
    (lambda m: m["spec"].update(serveConfigV2={"applications": []}), "serveConfigV2"),
], ids=["no-pod-template", "unknown-auth-mode", "serve-config-not-text"])
def test_the_schema_check_can_fail(breakage, where):
    manifest = _manifest(front_key_secret="hs-front", engine_key_secret="hs-token")
    broken = copy.deepcopy(manifest)
    breakage(broken)
    assert any(where in error for error in _errors(broken)), _errors(broken)


def test_the_pods_carry_the_roles_and_the_keys():
    manifest = _manifest(front_key_secret="hs-front", engine_key_secret="hs-token")
    cluster = manifest["spec"]["rayClusterConfig"]
    assert cluster["authOptions"] == {"mode": "token", "secretName": "hs-token"}  # the engine key: Ray's token
    assert cluster["headGroupSpec"]["resources"] == {"hybridserve_ingress": "1"}
    groups = {g["groupName"]: g for g in cluster["workerGroupSpecs"]}
    assert groups["prefill"]["resources"] == {"hybridserve_prefill": "1"} and groups["prefill"]["replicas"] == 1
    assert groups["decode"]["resources"] == {"hybridserve_decode": "1"}
    head = cluster["headGroupSpec"]["template"]["spec"]
    assert head["volumes"][0]["secret"]["secretName"] == "hs-front"
    assert head["containers"][0]["volumeMounts"][0]["mountPath"] == FRONT_KEY_DIR
    serve = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    args = serve["applications"][0]["args"]
    assert args["api_key_file"] == f"{FRONT_KEY_DIR}/key" and serve["http_options"]["host"] == "0.0.0.0"
    env = args["prefill_config"]["runtime_env"]["env_vars"]
    assert env["VLLM_SSM_CONV_STATE_LAYOUT"] == "DS" and "VLLM_CPU_OMP_THREADS_BIND" not in env  # the pod's cpuset


def test_launch_dry_run_prints_the_serve_config_that_export_writes(tmp_path):
    runner = CliRunner()
    dry = runner.invoke(app, ["launch", "--engine", "ray", "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    printed = json.loads(dry.stdout)
    out = tmp_path / "serve.yaml"
    written = runner.invoke(app, ["export", "ray", "-o", str(out)])
    assert written.exit_code == 0, written.output
    assert yaml.safe_load(out.read_text()) == printed
    assert "ray start --head" in dry.stderr and "hybridserve_prefill" in dry.stderr
    rayservice_file = tmp_path / "rayservice.yaml"
    assert runner.invoke(app, ["export", "kuberay", "-o", str(rayservice_file)]).exit_code == 0
    assert _errors(yaml.safe_load(rayservice_file.read_text())) == []


@pytest.mark.parametrize("argv, message", [
    (["launch", "--engine", "dynamo", "--dry-run"], "--engine dynamo: accepted: hybridserve"),
    (["launch", "--engine", "ray", "--role", "prefill", "--dry-run"], "--role prefill with --engine ray"),
], ids=["unknown-engine", "one-role"])
def test_refusals_are_one_line_exit_2(argv, message):
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
