"""The fault-injection patches on a stand-in for vLLM's NixlConnector pull worker (no vLLM needed)."""

import types

import pytest

from hybridserve.core.common.errors import InputError
from hybridserve.core.vllm_plugin import faults


class FakeNixl:
    def __init__(self):
        self.posted, self.released, self.states, self.num_made = [], [], {}, 0

    def make_prepped_xfer(self, *args):
        self.num_made += 1
        return self.num_made + 99

    def transfer(self, handle):
        self.posted.append(handle)
        self.states[handle] = "PROC"
        return "PROC"

    def check_xfer_state(self, handle):
        return self.states[handle]

    def release_xfer_handle(self, handle):
        self.released.append(handle)


def make_worker_class():
    class Worker:
        def __init__(self):
            self.nixl_wrapper, self._recving_transfers, self._recving_metadata = FakeNixl(), {}, {}

        def _read_blocks(self, read_spec, dst_engine_id, request_id, *rest):
            handle = self.nixl_wrapper.make_prepped_xfer("READ")
            self.nixl_wrapper.transfer(handle)
            self._recving_transfers.setdefault(request_id, []).append(handle)
            return True

        def get_transfer_results(self):  # vLLM: a request is done when none of its handles is in flight
            done = {r for r, hs in self._recving_transfers.items()
                    if all(self.nixl_wrapper.states.get(h) == "DONE" for h in hs)}
            for r in done:
                del self._recving_transfers[r]
                self._recving_metadata.pop(r, None)
            return types.SimpleNamespace(finished_recving=done, failed_recving=set())

    return Worker


def test_parse_fault():
    assert faults.parse_fault(None) is None and faults.parse_fault(" ") is None
    assert faults.parse_fault("Early-Completion") is faults.FaultKind.EARLY_COMPLETION
    with pytest.raises(InputError, match="zero_after_transfer"):
        faults.parse_fault("melt")


def test_clean_worker_waits_for_the_bytes():
    worker = make_worker_class()()
    worker._read_blocks(None, "p", "req-1")
    assert worker.get_transfer_results().finished_recving == set()  # READ still in flight


def test_early_completion_reports_done_before_the_read_is_posted():
    cls = make_worker_class()
    faults.patch_worker_module(types.SimpleNamespace(NixlPullConnectorWorker=cls), faults.FaultKind.EARLY_COMPLETION)
    worker = cls()
    worker._read_blocks(None, "p", "req-1")
    assert worker.nixl_wrapper.posted == []
    assert worker.get_transfer_results().finished_recving == {"req-1"}  # reported done, no bytes moved
    for _ in range(faults.LATE_STEPS - 1):
        worker.get_transfer_results()
    assert worker.nixl_wrapper.posted == [100]  # the READ lands while decode already runs
    worker.nixl_wrapper.states[100] = "DONE"
    worker.get_transfer_results()
    assert worker.nixl_wrapper.released == [100]


def fake_kv_worker(cls, torch):
    """Two groups (0: GDN state, 1: attention) on one shared tensor region of 8 blocks x 16 bytes."""
    worker = cls()
    cache = torch.arange(8 * 16, dtype=torch.uint8).reshape(8, 16).clone()
    worker.engine_id, worker.tp_rank = "d", 0
    worker.kv_caches_base_addr = {"d": {0: [cache.data_ptr()]}}
    worker.device_kv_caches = {"layer": cache}
    worker.region_names, worker.region_group_ids = ["layer"], [-1]
    worker.region_num_blocks, worker.block_len_per_layer, worker.block_stride_per_layer = [8], [16], [16]
    specs = [type("MambaSpec", (), {})(), type("FullAttentionSpec", (), {})()]
    worker.kv_cache_config = types.SimpleNamespace(
        kv_cache_groups=[types.SimpleNamespace(kv_cache_spec=s) for s in specs])
    return worker, cache


@pytest.mark.parametrize("kind", [faults.FaultKind.ZERO_AFTER_TRANSFER, faults.FaultKind.STALE_STATE])
def test_pages_are_overwritten_after_the_transfer(kind):
    torch = pytest.importorskip("torch")
    cls = make_worker_class()
    faults.patch_worker_module(types.SimpleNamespace(NixlPullConnectorWorker=cls), kind)
    worker, cache = fake_kv_worker(cls, torch)
    before = cache.clone()
    for req, (gdn, attn) in (("a", (1, [2, 3])), ("b", (4, [5]))):
        worker._read_blocks(None, "p", req)
        worker._recving_metadata[req] = types.SimpleNamespace(local_physical_block_ids=[[gdn], attn])
        worker.nixl_wrapper.states[worker._recving_transfers[req][0]] = "DONE"
        worker.get_transfer_results()
    changed = {b for b in range(8) if not torch.equal(cache[b], before[b])}
    if kind is faults.FaultKind.ZERO_AFTER_TRANSFER:
        assert changed == {2, 3, 5} and int(cache[[2, 3, 5]].sum()) == 0  # attention only; GDN kept
    else:
        assert changed == {4} and torch.equal(cache[4], before[1])  # b's GDN state = a's (stale)


def test_the_switch_file_arms_and_disarms_each_fault_in_a_running_worker(tmp_path):
    torch = pytest.importorskip("torch")
    switch = tmp_path / "fault"
    cls = make_worker_class()
    faults.patch_worker_module(types.SimpleNamespace(NixlPullConnectorWorker=cls), None,
                               faults.armed_from_file(switch))  # no file yet: nothing acts
    worker, cache = fake_kv_worker(cls, torch)
    before = cache.clone()

    def request(name, gdn, attn):
        worker._read_blocks(None, "p", name)
        worker._recving_metadata[name] = types.SimpleNamespace(local_physical_block_ids=[[gdn], attn])
        for handle in worker._recving_transfers.get(name, []):
            worker.nixl_wrapper.states[handle] = "DONE"
        return worker.get_transfer_results().finished_recving

    assert request("clean", 1, [2]) == {"clean"} and worker.nixl_wrapper.posted == [100]
    switch.write_text("zero_after_transfer")
    request("zeroed", 3, [4])
    assert int(cache[4].sum()) == 0 and torch.equal(cache[3], before[3])  # attention wiped, GDN kept
    switch.write_text("early_completion")
    assert request("early", 5, [6]) == {"early"} and worker.nixl_wrapper.posted == [100, 101]  # not posted
    switch.write_text("")  # disarmed: the next read is posted at once, the late one still lands
    assert request("after", 7, [0]) == {"after"} and worker.nixl_wrapper.posted == [100, 101, 103]  # at once
    for _ in range(faults.LATE_STEPS):
        worker.get_transfer_results()
    assert worker.nixl_wrapper.posted == [100, 101, 103, 102]  # the early request's READ, posted late
    assert torch.equal(cache[0], before[0]) and torch.equal(cache[6], before[6])  # nothing overwritten when off


def test_a_switchable_deployment_hands_the_decode_server_its_switch_file(tmp_path):
    from hybridserve.core.deployments import deployed as deployments
    from hybridserve.core.deployments.target import RECALL_MODEL_DIR, Config

    switch = tmp_path / "fault"
    topology = deployments.config_topology(Config.PD_ASYNC, RECALL_MODEL_DIR, 8800, 2,
                                           faults.FaultKind.STALE_STATE, fault_file=switch)
    assert [dict(d.env).get(faults.FAULT_FILE_ENV) for d in topology.decode] == [str(switch)]
    assert all(faults.FAULT_FILE_ENV not in dict(p.env) and faults.FAULT_ENV not in dict(p.env)
               for p in topology.prefill)
    deployment = deployments.Deployment(url="http://x", run_dir=tmp_path, engine_logs=(), fault_file=switch)
    deployment.arm(faults.FaultKind.EARLY_COMPLETION)
    assert faults.armed_from_file(switch)() is faults.FaultKind.EARLY_COMPLETION
    deployment.arm(None)
    assert switch.read_text() == "" and faults.armed_from_file(switch)() is None
    with pytest.raises(InputError, match="no fault switch"):
        deployments.Deployment(url="http://x", run_dir=None, engine_logs=()).arm(None)


# vLLM 0.26's layout, as its model runner allocates it: one int8 buffer per KVCacheTensor (size bytes, shared_by
# layers), group g's logical block b in bytes [b * page, (b + 1) * page) of each buffer its layers use; GDN layers
# hold (conv, ssm) views of it. The stand-in below has 2 tensors, each shared by one GDN and one attention layer.
class Spec026:  # stands in for vLLM's spec classes: the fault tells them apart by class name
    pass


class MambaSpec(Spec026):
    pass


class FullAttentionSpec(Spec026):
    pass


def worker_026(num_blocks=6, page=32):
    torch = pytest.importorskip("torch")
    buffers = [torch.arange(num_blocks * page, dtype=torch.int16).remainder(97).to(torch.int8) + i for i in range(2)]
    tensors = [types.SimpleNamespace(size=num_blocks * page, shared_by=[f"gdn.{i}", f"attn.{i}"]) for i in range(2)]
    caches = {}
    for i, buf in enumerate(buffers):
        caches[f"gdn.{i}"] = (buf[: num_blocks * 8], buf[num_blocks * 8:])  # views, like (conv, ssm)
        caches[f"attn.{i}"] = buf.view(num_blocks * 2, page // 2)  # two kernel blocks per logical block
    groups = [types.SimpleNamespace(layer_names=["gdn.0", "gdn.1"], kv_cache_spec=MambaSpec()),
              types.SimpleNamespace(layer_names=["attn.0", "attn.1"], kv_cache_spec=FullAttentionSpec())]
    config = types.SimpleNamespace(num_blocks=num_blocks, kv_cache_tensors=tensors, kv_cache_groups=groups)
    return types.SimpleNamespace(kv_cache_config=config, device_kv_caches=caches), buffers, page


def test_stale_state_on_026_copies_the_gdn_pages_of_every_tensor_and_nothing_else():
    worker, buffers, page = worker_026()
    before = [b.clone() for b in buffers]
    meta = types.SimpleNamespace(local_block_ids=[[4], [1, 2]], local_physical_block_ids=[[4], [2, 3, 4, 5]])
    num = faults._overwrite(worker, meta, want_gdn=True, source={0: [0]})
    assert num == 2  # block 4 of the GDN group, in both tensors
    for buf, old in zip(buffers, before):
        assert buf[4 * page:5 * page].tolist() == old[0:page].tolist()  # the stale page
        assert buf[:4 * page].tolist() == old[:4 * page].tolist() and buf[5 * page:].tolist() == old[5 * page:].tolist()


def test_zero_after_transfer_on_026_zeroes_the_attention_blocks_by_logical_id():
    worker, buffers, page = worker_026()
    before = [b.clone() for b in buffers]
    meta = types.SimpleNamespace(local_block_ids=[[4], [1, 2]], local_physical_block_ids=[[4], [2, 3, 4, 5]])
    assert faults._overwrite(worker, meta, want_gdn=False, source=None) == 4
    for buf, old in zip(buffers, before):
        assert not buf[page:3 * page].any()  # logical blocks 1 and 2: kernel blocks 2-5
        assert buf[:page].tolist() == old[:page].tolist() and buf[3 * page:].tolist() == old[3 * page:].tolist()


def test_a_buffer_that_is_not_the_declared_size_is_refused_not_written():
    worker, buffers, page = worker_026()
    worker.kv_cache_config.kv_cache_tensors[1].size += page
    meta = types.SimpleNamespace(local_block_ids=[[4], [1]])
    with pytest.raises(ValueError, match="bytes allocated"):
        faults._overwrite(worker, meta, want_gdn=True, source={0: [0]})
