"""On CUDA vLLM refuses to capture graphs for a hybrid model when max_num_seqs exceeds the KV pool's blocks (each
decode sequence holds one GDN state block). Launch caps `--max-num-seqs` where vLLM's own default would not start:
exactly from `--kv-cache-memory-bytes`, from plan's estimate (90 %) from a share. The exact counts are the H200's
(2026-12-05, vLLM 0.26, the 60-layer bench model whose config is tests/data/m60-config.json): 6g held 93 blocks,
12g 186, in vLLM's own refusal "max_num_seqs (1024) exceeds available Mamba cache blocks (93)"."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hybridserve.cli.app import app
from hybridserve.core.common.errors import InputError
from hybridserve.core.launch.seqs_fit import STATE_HEADROOM, kv_cache_flag, parse_vllm_bytes, vllm_default_max_num_seqs
from hybridserve.core.supervise.start_failure import start_failure

runner = CliRunner()
DATA = Path(__file__).resolve().parent / "data"
PROFILES = Path(__file__).resolve().parent.parent / "profiles" / "models"
GIB = 2**30


@pytest.fixture(autouse=True)
def no_gpu_here(monkeypatch):
    monkeypatch.setattr("hybridserve.core.launch.machine.gpu_memory_bytes", lambda gpu=0: None)
    monkeypatch.setattr("hybridserve.core.launch.machine.gpu_name", lambda gpu=0: None)


def _folder(tmp_path: Path, config: Path) -> Path:
    folder = tmp_path / config.stem
    folder.mkdir()
    shutil.copy(config, folder / "config.json")
    return folder


def _engines(args: list[str]) -> list[dict]:
    result = runner.invoke(app, ["launch", "--role", "all", "--dry-run", "--json", "--device", "cuda", *args])
    assert result.exit_code == 0, result.output
    return [c for c in json.loads(result.stdout)["commands"] if c["role"] in ("prefill", "decode")]


def _seqs(argv: list[str]) -> str | None:
    return argv[argv.index("--max-num-seqs") + 1] if "--max-num-seqs" in argv else None


@pytest.mark.parametrize("kv, blocks", [("6g", "93"), ("12g", "186")])
def test_the_cap_from_a_fixed_kv_cache_is_the_count_vllm_reported_on_the_h200(tmp_path, kv, blocks):
    model = _folder(tmp_path, DATA / "m60-config.json")
    for c in _engines(["-m", str(model), "--gpu-memory", "h200", "--", "--kv-cache-memory-bytes", kv]):
        assert _seqs(c["argv"]) == blocks
        assert f"exceeds the {blocks} state blocks its --kv-cache-memory-bytes holds" in \
            c["limits"]["max_num_seqs"]["reason"]


def test_a_share_is_capped_at_90_percent_of_plans_estimate_and_a_roomy_one_not_at_all(tmp_path):
    """P and D on one H200 at 0.46 each: the 60-layer model's 64 MB blocks give ~1,011, under vLLM's 1,024 (the
    H200's own dry run, its driver's 140.4 GiB, wrote 913 of ~1,015); the 9B's blocks leave vLLM its default."""
    engines = _engines(["-m", str(_folder(tmp_path, DATA / "m60-config.json")), "--gpu-memory", "h200"])
    (m60,) = {_seqs(c["argv"]) for c in engines}
    assert m60 == str(int(STATE_HEADROOM * 1011)) and "~1,011 state blocks" in engines[0]["limits"]["max_num_seqs"]["reason"]
    for c in _engines(["-m", str(_folder(tmp_path, PROFILES / "qwen3.5-9b.json")), "--gpu-memory", "h200"]):
        assert _seqs(c["argv"]) is None and "vLLM's default (1,024), within" in c["limits"]["max_num_seqs"]["reason"]


def test_what_is_asked_eager_or_an_unknown_gpu_changes_nothing(tmp_path):
    model = str(_folder(tmp_path, DATA / "m60-config.json"))
    kv = ["--", "--kv-cache-memory-bytes", "6g"]
    assert {_seqs(c["argv"]) for c in _engines(["-m", model, "--gpu-memory", "h200", "--max-num-seqs", "40", *kv])} \
        == {"40"}
    assert {_seqs(c["argv"]) for c in _engines(["-m", model, "--gpu-memory", "h200", "--enforce-eager", *kv])} \
        == {None}  # vLLM checks the blocks only when it captures full CUDA graphs
    unknown = _engines(["-m", model, *kv])  # no GPU known: vLLM's default unknown, and the dry run says so
    assert {_seqs(c["argv"]) for c in unknown} == {None}
    assert all("not checked against the GDN state blocks" in c["limits"]["max_num_seqs"]["reason"] for c in unknown)


def test_an_attention_only_model_is_never_capped(tmp_path):
    model = _folder(tmp_path, PROFILES / "gemma-3-4b-it.json")
    for c in _engines(["-m", str(model), "--gpu-memory", "h200", "--", "--kv-cache-memory-bytes", "1g"]):
        assert _seqs(c["argv"]) is None


def test_vllms_defaults_and_byte_suffixes_mirror_its_own():
    assert vllm_default_max_num_seqs(141 * GIB, "NVIDIA H200") == 1024
    assert vllm_default_max_num_seqs(80 * GIB, "NVIDIA A100-SXM4-80GB") == 256
    assert vllm_default_max_num_seqs(180 * GIB, "NVIDIA B200") == 1024
    assert vllm_default_max_num_seqs(48 * GIB, None) == 256
    assert [parse_vllm_bytes(t) for t in ("6g", "6G", "1.5k", "1024")] == [6 * 10**9, 6 * GIB, 1500, 1024]
    assert kv_cache_flag(("--kv-cache-memory-bytes", "1g", "--kv-cache-memory-bytes=2G")) == 2 * GIB
    with pytest.raises(InputError, match="--kv-cache-memory-bytes 1.5G: accepted"):
        parse_vllm_bytes("1.5G")


def test_vllms_refusal_names_the_cap_that_fits(tmp_path):
    log = tmp_path / "prefill-0.log"
    log.write_text("(EngineCore pid=1) ERROR 12-05 01:57:41 [core.py:1] ValueError: max_num_seqs (1024) exceeds "
                   "available Mamba cache blocks (93). Each decode sequence requires one Mamba cache block, so CUDA "
                   "graph capture cannot proceed.\nRuntimeError: Engine core initialization failed. See root cause "
                   "above.\n")
    assert "(launch: --max-num-seqs 93 fits this engine's memory" in start_failure(log)


def test_the_benchmarks_equal_cap_is_launchs_own(tmp_path):
    """served_h200.py and equal_resources.py give every engine of a comparison the cap launch writes for a fixed KV
    cache: the same count, from the same arithmetic."""
    from hybridserve.core.launch.seqs_fit import fixed_kv_blocks

    model = _folder(tmp_path, DATA / "m60-config.json")
    assert (fixed_kv_blocks(str(model), "6g"), fixed_kv_blocks(str(model), "12g")) == (93, 186)
    (written,) = {_seqs(c["argv"]) for c in _engines(["-m", str(model), "--gpu-memory", "h200", "--",
                                                      "--kv-cache-memory-bytes", "5g"])}
    assert written == str(fixed_kv_blocks(str(model), "5g"))


def test_plan_shows_the_sequence_ceiling_of_a_hybrid_model_and_whether_vllms_default_fits(tmp_path):
    model = str(_folder(tmp_path, DATA / "m60-config.json"))
    shared = runner.invoke(app, ["plan", "-m", model, "--memory", "h200", "--roles-per-gpu", "2",
                                 "--mamba-ssm-cache-dtype", "float32", "--prompt-len", "1024"], env={"COLUMNS": "200"})
    assert shared.exit_code == 0, shared.output
    assert "at most 1,011 (vLLM's default 1,024 exceeds them" in shared.output  # launch's own count (above)
    roomy = runner.invoke(app, ["plan", "-m", "qwen3.5-9b", "--memory", "h200", "--prompt-len", "1024"],
                          env={"COLUMNS": "200"})
    assert "(vLLM's default 1,024 fits)" in roomy.output
    too_big = runner.invoke(app, ["plan", "-m", "qwen3.5-397b-a17b", "--memory", "h200", "--prompt-len", "1024"],
                            env={"COLUMNS": "200"})
    assert "none: the weights leave no KV cache at this share" in too_big.output  # TP 1: no cap to speak of
    attention_only = runner.invoke(app, ["plan", "-m", "gemma-3-4b-it", "--memory", "h200"], env={"COLUMNS": "200"})
    assert attention_only.exit_code == 0 and "GDN state block" not in attention_only.output
