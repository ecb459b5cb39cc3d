"""`launch --engine ray` writes its Serve config from the same launch plan as launch: the hybrid rules, NIXL and the
plugin's switches reach every engine, host-bound settings do not, and roles are pinned by Ray resources."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from hybridserve.core.common.errors import InputError
from hybridserve.core.launch.launch_plan import Role, make_launch_plan
from hybridserve.core.launch.topology import EngineInstance, ProxyInstance, local_topology
from hybridserve.core.rayserve.engine_kwargs import engine_kwargs
from hybridserve.core.rayserve.serve_config import (
    HOST_BOUND_ENV, INGRESS_RESOURCE, host_resources, ray_start_lines, serve_config,
)


def _args(topology=None) -> dict:  # noqa: ANN001
    plan = make_launch_plan(topology or local_topology(), Role.ALL)
    return serve_config(plan)["applications"][0]["args"]


@pytest.mark.parametrize("flags, expected", [
    (["--block-size", "128"], {"block_size": 128}),
    (["--no-enable-prefix-caching"], {"enable_prefix_caching": False}),
    (["--enforce-eager"], {"enforce_eager": True}),
    (["--kv-transfer-config", '{"kv_connector":"NixlConnector"}'],
     {"kv_transfer_config": {"kv_connector": "NixlConnector"}}),
    (["--load-format=dummy", "--gpu-memory-utilization", "0.45"],
     {"load_format": "dummy", "gpu_memory_utilization": 0.45}),
    (["--model", "/m", "--host", "1.2.3.4", "--port", "1", "--middleware", "x.Y", "--seed", "-1"],
     {"seed": -1}),
    (["--dtype", "bfloat16", "--attention-backend", "CPU_ATTN"], {"dtype": "bfloat16", "attention_backend": "CPU_ATTN"}),
    (["--kv-cache-memory-bytes", "6g", "--max-num-batched-tokens=8K", "--max-model-len", "auto"],
     {"kv_cache_memory_bytes": 6_000_000_000, "max_num_batched_tokens": 8192, "max_model_len": -1}),
    (["--max-model-len", "34816"], {"max_model_len": 34816}),
], ids=["int", "negated", "switch", "json", "inline-and-float", "serve-owned-dropped", "text", "human-readable",
        "plain-int"])
def test_flags_become_engine_kwargs(flags, expected):
    assert engine_kwargs(tuple(flags)) == expected


def test_a_size_vllm_would_refuse_is_refused_in_one_line():
    with pytest.raises(InputError, match="--kv-cache-memory-bytes 1.5G: accepted"):
        engine_kwargs(("--kv-cache-memory-bytes", "1.5G"))  # vLLM: no decimals with binary suffixes


def test_a_short_flag_is_refused_in_one_line():
    with pytest.raises(InputError, match="'-tp'.*long flags"):
        engine_kwargs(("-tp", "2"))


def test_every_flag_launch_gives_an_engine_reaches_ray():
    """The command line launch runs and the engine_kwargs Ray gets come from one plan: every flag is there."""
    plan = make_launch_plan(local_topology(), Role.ALL)
    args = serve_config(plan)["applications"][0]["args"]
    for command in (plan.command("prefill-0"), plan.command("decode-0")):
        kwargs = args[f"{command.role.value}_config"]["engine_kwargs"]
        flags = [a for a in command.argv[3:] if a.startswith("--")]
        for flag in flags:
            name = flag[2:].removeprefix("no-").replace("-", "_")
            if flag not in ("--model", "--served-model-name", "--host", "--port"):
                assert name in kwargs, flag
        assert set(kwargs) <= {f[2:].removeprefix("no-").replace("-", "_") for f in flags}


def test_hybrid_rules_and_nixl_on_both_roles():
    args = _args()
    prefill, decode = args["prefill_config"], args["decode_config"]
    for config in (prefill, decode):
        kw, env = config["engine_kwargs"], config["runtime_env"]["env_vars"]
        assert env["VLLM_SSM_CONV_STATE_LAYOUT"] == "DS"
        assert kw["enable_prefix_caching"] is False and kw["disable_hybrid_kv_cache_manager"] is False
        assert kw["kv_transfer_config"]["kv_connector"] == "NixlConnector"
        assert kw["kv_transfer_config"]["kv_load_failure_policy"] == "fail"
        assert config["accelerator_config"] == {"kind": "cpu"}
        assert not set(env) & (HOST_BOUND_ENV - {"PYTHONPATH"})  # set per replica (servers.bind_to_node)
        assert env["PYTHONPATH"].endswith("core/vllm_plugin/startup:${PYTHONPATH}")  # the shims, in every worker
    for key in ("block_size", "mamba_ssm_cache_dtype", "mamba_cache_dtype", "dtype", "max_model_len"):
        assert prefill["engine_kwargs"][key] == decode["engine_kwargs"][key], key
    assert (prefill["engine_kwargs"]["kv_transfer_config"]["kv_role"],
            decode["engine_kwargs"]["kv_transfer_config"]["kv_role"]) == ("kv_producer", "kv_consumer")
    # launch's CPU binding: prefill core 0, decode core 1 (two cores)
    assert (prefill["runtime_env"]["env_vars"]["VLLM_CPU_OMP_THREADS_BIND"],
            decode["runtime_env"]["env_vars"]["VLLM_CPU_OMP_THREADS_BIND"]) == ("0", "1")
    assert "HYBRIDSERVE_RELEASE_DEAD_PEERS" in decode["runtime_env"]["env_vars"]
    assert prefill["experimental_configs"]["NIXL_SIDE_CHANNEL_PORT_BASE"] == 8150  # the topology's side channel
    assert decode["experimental_configs"]["NIXL_SIDE_CHANNEL_PORT_BASE"] == 8250


def _two_hosts(**prefill_overrides) -> object:
    base = local_topology()
    prefill = (EngineInstance(host="10.88.0.1", port=8100, side_channel_port=5600, devices=(0,)),
               EngineInstance(**{"host": "10.88.0.3", "port": 8100, "side_channel_port": 5600, "devices": (0,),
                                 **prefill_overrides}))
    decode = (EngineInstance(host="10.88.0.2", port=8200, side_channel_port=5601, devices=(1,)),)
    return replace(base, prefill=prefill, decode=decode, proxy=ProxyInstance(host="10.88.0.1", port=8000))


def test_instances_become_replicas_pinned_by_resources():
    topology = _two_hosts()
    args = _args(topology)
    assert args["prefill_config"]["deployment_config"]["num_replicas"] == 2
    assert args["decode_config"]["deployment_config"]["num_replicas"] == 1
    assert args["prefill_config"]["placement_group_config"]["bundles"] == [{"CPU": 1.0, "hybridserve_prefill": 1.0}]
    assert args["ingress_deployment_config"]["ray_actor_options"]["resources"] == {INGRESS_RESOURCE: 0.01}
    assert host_resources(topology) == {"10.88.0.1": {INGRESS_RESOURCE: 1.0, "hybridserve_prefill": 1.0},
                                        "10.88.0.3": {"hybridserve_prefill": 1.0},
                                        "10.88.0.2": {"hybridserve_decode": 1.0}}
    lines = ray_start_lines(topology, head="10.88.0.1", num_cpus=8)
    assert lines[0].startswith("ray start --head --port 6379 --node-ip-address 10.88.0.1")
    assert lines[1].startswith("ray start --address 10.88.0.1:6379 --node-ip-address 10.88.0.3")
    assert json.loads(lines[2].split("--resources ")[1].strip("'")) == {"hybridserve_decode": 1.0}


def test_tp_gives_a_bundle_per_rank_on_one_host():
    topology = replace(local_topology(num_cores=4), decode=(EngineInstance(port=8200, side_channel_port=8250, tp=2,
                                                                           devices=(2, 3)),))
    config = _args(topology)["decode_config"]
    assert config["placement_group_config"] == {"bundles": [{"CPU": 1.0, "hybridserve_decode": 1.0}, {"CPU": 1.0}],
                                                "strategy": "STRICT_PACK"}
    assert config["runtime_env"]["env_vars"]["VLLM_CPU_OMP_THREADS_BIND"] == "2|3"


def test_instances_of_a_role_that_differ_are_refused():
    with pytest.raises(InputError, match=r"prefill-1: its engine_kwargs differs from prefill-0's.*one Ray deployment"):
        _args(_two_hosts(tp=2, devices=(0, 1)))


def test_one_role_is_refused():
    plan = make_launch_plan(local_topology(), Role.PREFILL)
    with pytest.raises(InputError, match="--role prefill with --engine ray.*--role all"):
        serve_config(plan)


def test_cuda_roles_sharing_a_gpu_take_their_memory_share_of_it():
    from hybridserve.core.launch.topology import Device

    plan = make_launch_plan(local_topology(device=Device.CUDA, num_gpus=1), Role.ALL)
    args = serve_config(plan)["applications"][0]["args"]
    for role in ("prefill", "decode"):
        config = args[f"{role}_config"]
        assert config["accelerator_config"] == {"kind": "gpu"}
        assert config["placement_group_config"]["bundles"] == [{"GPU": 0.46, f"hybridserve_{role}": 1.0}]
        assert config["engine_kwargs"]["gpu_memory_utilization"] == 0.46
        assert "CUDA_VISIBLE_DEVICES" not in config["runtime_env"]["env_vars"]  # Ray hands out the GPU


def test_ray_and_vllm_take_both_configs():
    """Ray's own check (LLMConfig -> its vLLM engine config): an engine_kwargs name that is neither an AsyncEngineArgs
    nor a FrontendArgs field is refused there ("Unknown engine argument"); P and D must share the model id."""
    pytest.importorskip("ray.llm", reason="needs the ray extra")
    from hybridserve.core.rayserve import shims  # noqa: F401 (torchvision, as in the replicas)
    from ray.llm._internal.serve.serving_patterns.prefill_decode.builder import PDServingArgs

    args = _args()
    pd = PDServingArgs.model_validate({k: v for k, v in args.items() if k in ("prefill_config", "decode_config",
                                                                              "ingress_deployment_config")})
    for config in (pd.prefill_config, pd.decode_config):
        engine = config.get_engine_config()
        assert engine.engine_kwargs["enable_prefix_caching"] is False
        assert engine.engine_kwargs["block_size"] == args["decode_config"]["engine_kwargs"]["block_size"]
    bad = {**args["prefill_config"], "engine_kwargs": {**args["prefill_config"]["engine_kwargs"], "not_a_flag": 1}}
    with pytest.raises(ValueError, match="Unknown engine argument: not_a_flag"):
        PDServingArgs.model_validate({"prefill_config": bad, "decode_config": args["decode_config"]}
                                     ).prefill_config.get_engine_config()
