"""Every command's numeric and path options driven with odd values: each is either refused in one line with exit 2
or accepted (the library call that would start real work is replaced by one that says it was reached); never a
traceback, never an exit 1 from a crash. Where work would start (servers, kernels, NIXL agents, requests), the
test stops at the library call."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from hybridserve.cli.app import app


class Reached(Exception):
    """The input was accepted and real work would have started here."""


def _reached(*_args, **_kwargs):
    raise Reached


WORK = ("hybridserve.cli.launch._run", "hybridserve.kernels.verify.run_verify", "hybridserve.kernels.tune.run_tune",
        "hybridserve.core.validate.validate", "hybridserve.transfer.xfer_bench.Cluster")

INTS = ["-1", "0", "1", "2", "3", "65535", "65536", "70000", str(2**63), "-99999999999999999999"]
FLOATS = ["-1", "0", "0.5", "1", "2", "nan", "inf", "-inf", "1e309"]
PATHS = ["/nonexistent_dir/x.yaml", "{dir}", "{binary}", "{empty}", "{text}"]

# (command words, fixed arguments, {option: kind}); kinds: int, float, path
COMMANDS = [
    (["plan"], ["-m", "qwen3.5-0.8b", "--memory", "h200"],
     {"--tp": "int", "--decode-tp": "int", "--block-size": "int", "--num-speculative-tokens": "int",
      "--prompt-len": "int", "--runs": "int", "--gpu-memory-utilization": "float", "--weights-gib": "float",
      "--reserved-gib": "float", "-m": "path"}),
    (["verify"], ["--backend", "torch", "--model", "qwen3.5-0.8b", "--tp", "1"],
     {"--head-dim": "int", "--long-len": "int", "--tp": "int", "--tolerance": "float", "--model": "path"}),
    (["tune"], ["--backend", "torch", "--model", "qwen3.5-0.8b", "--tp", "1", "--out", "{tmp}/t.yaml"],
     {"--tp": "int", "--reps": "int", "--input-sets": "int", "--verify-max-len": "int", "--out": "path",
      "--plot": "path", "--prompt-lengths": "path"}),
    (["launch", "--role", "all", "--dry-run"], [],
     {"--base-port": "int", "--max-model-len": "int", "--block-size": "int", "--index": "int", "--model": "path",
      "--num-speculative-tokens": "int",
      "--topology": "path"}),
    (["launch", "--role", "proxy"], ["--run-dir", "{tmp}/runs"],
     {"--base-port": "int", "--timeout": "float", "--run-dir": "path"}),
    (["validate"], ["--baseline", "http://127.0.0.1:9", "--candidate", "http://127.0.0.1:9"],
     {"--num-prompts": "int", "--max-tokens": "int", "--concurrency": "int", "--timeout": "float",
      "--max-accuracy-drop": "float", "--min-token-agreement": "float", "--max-logprob-drift": "float",
      "--near-tie-tolerance": "float", "--max-failed-requests": "float", "--thresholds": "path",
      "--dataset": "path", "--junit": "path"}),
    (["validate"], ["--run-dir", "{tmp}/runs"], {"--base-port": "int", "--model": "path"}),
    (["transfer", "bench"], ["-m", "qwen3.5-0.8b", "--prompt-len", "256"],
     {"--prefill-tp": "int", "--decode-tp": "int", "--prompt-len": "int", "--requests": "int", "--block-size": "int",
      "--num-speculative-tokens": "int", "--timeout": "float", "--png": "path", "-m": "path"}),
]
VALUES = {"int": INTS, "float": FLOATS, "path": PATHS}
CASES = [(words, fixed, option, kind) for words, fixed, options in COMMANDS for option, kind in options.items()]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("odd")
    (tmp / "binary").write_bytes(bytes(range(256)) * 4)
    (tmp / "empty").write_bytes(b"")
    (tmp / "text").write_text("just: text\n")
    (tmp / "dir").mkdir()
    return {"tmp": str(tmp), "dir": str(tmp / "dir"), "binary": str(tmp / "binary"), "empty": str(tmp / "empty"),
            "text": str(tmp / "text")}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(CASES), data=st.data())
def test_odd_values_are_refused_in_one_line_or_accepted(case, data, files, monkeypatch):
    for target in WORK:
        monkeypatch.setattr(target, _reached)
    words, fixed, option, kind = case
    value = data.draw(st.sampled_from(VALUES[kind]), label=option).format(**files)
    args = [*words, *(a.format(**files) for a in fixed), option, value]
    result = CliRunner().invoke(app, args)
    if isinstance(result.exception, Reached):
        return  # accepted: the work would start now
    assert result.exit_code in (0, 2), (args, result.exit_code, result.output, repr(result.exception))
    assert "Traceback" not in result.output, (args, result.output)
    if result.exit_code == 2 and result.output.startswith("error:"):
        assert len(result.output.strip().splitlines()) == 1, (args, result.output)  # one line


@pytest.mark.parametrize("args,message", [
    (["launch", "--role", "all", "--base-port", "65500"], "prefill-0: port 65600 is not a TCP port; accepted: 1-65535"),
    (["launch", "--role", "all", "--base-port", "-1"], "proxy: port -1 is not a TCP port; accepted: 1-65535"),
    (["launch", "--role", "all", "--dry-run", "--base-port", "70000"], "proxy: port 70000 is not a TCP port"),
    (["verify", "--backend", "torch", "--head-dim", "0"], "--head-dim 0: accepted: 1 or more"),
    (["validate", "--thresholds", "{binary}"], "--thresholds {binary}: not a UTF-8 text file"),
    (["launch", "--role", "all", "--dry-run", "--max-model-len", "0"], "Invalid value for '--max-model-len': Input should be greater than or equal to 1"),
    # plan's served model (core/layout/served.py) lists block ids: 2**63 overflowed range(), so both are bounded
    (["plan", "-m", "qwen3.5-0.8b", "--num-speculative-tokens", str(2**63)],
     f"--num-speculative-tokens {2**63}: accepted: 0-1048576"),
    (["plan", "-m", "qwen3.5-0.8b", "--prompt-len", str(2**63)], f"--prompt-len {2**63}: accepted: 1-1048576 tokens"),
], ids=["base-port-65500", "base-port-minus-1", "dry-run-70000", "head-dim-0", "binary-thresholds",
        "max-model-len-0", "plan-spec-tokens-2**63", "plan-prompt-len-2**63"])
def test_the_reported_inputs_are_refused_in_one_line(args, message, files, monkeypatch, capsys):
    """The newcomer's traceback inputs, through the console entry point (one line on stderr, exit 2)."""
    import sys

    from hybridserve.cli.app import main

    for target in WORK:
        monkeypatch.setattr(target, _reached)
    monkeypatch.setattr(sys, "argv", ["hybridserve", *(a.format(**files) for a in args)])
    with pytest.raises(SystemExit) as exit_info:
        main()
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert message.format(**files) in err and len(err.strip().splitlines()) == 1, err
