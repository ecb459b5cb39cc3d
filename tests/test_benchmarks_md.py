"""BENCHMARKS.md and benchmarks/ as a newcomer reads them: today's numbers first and the file a few screens long,
each row's command and section real, no current row from a configuration no user runs; the history in its own file,
each entry naming a commit that holds it and each run that left the table its reason; scripts named for what they
measure, each naming its command and section; the H200 runner's stages named and documented, and each stage's
commands (printed by its dry mode) naming scripts and CLI options that exist."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from typer.main import get_command

from hybridserve.cli.app import app

ROOT = Path(__file__).resolve().parent.parent
TEXT = (ROOT / "BENCHMARKS.md").read_text()
HEAD = TEXT.splitlines()[:40]
HISTORY = (ROOT / "benchmarks" / "HISTORY.md").read_text()
RUNNER = ROOT / "benchmarks" / "h200.sh"
HEADINGS = {line.lstrip("#").strip() for line in TEXT.splitlines() if line.startswith("#")}
QUESTIONS = ("plan speed", "kernel choice", "transfer bench", "served P/D idle", "served P/D under load", "validate",
             "CI time")
# a name part that names a work item, not a measurement: issue13, gpu13, stage14, chain; run4 (a numbered run of a
# measurement) and GPU models (h200) are names of what was measured
WORK_ITEM = re.compile(r"^(issue|stage|step|item|task)\d+$|chain|^[a-z]+\d+$")
MEASURED_NAMES = re.compile(r"^(run\d+[a-z]?|[abh]\d{3})$")


def _served_h200_cuda_profile(folder: Path):
    """served_h200.py and its CUDA profile, the 60-layer bench model's config (tests/data) in `folder`, not the
    machine's /tmp/m60: a fresh box has none (the first run here without it failed on load_model)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("served_h200", ROOT / "benchmarks/served_h200.py")
    served = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(served)
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text((ROOT / "tests/data/m60-config.json").read_text())
    return served, dict(served.profile(False), model=str(folder))


def _rows() -> list[dict[str, str]]:
    start = next(i for i, line in enumerate(HEAD) if line.startswith("| question |"))
    names = [c.strip() for c in HEAD[start].strip("|").split("|")]
    rows = []
    for line in HEAD[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(names, (c.strip() for c in line.strip("|").split("|")))))
    return rows


def _cli():  # noqa: ANN202 - typer's own click group (typer vendors click)
    return get_command(app)


def _parse_cli(argv: list[str]) -> None:
    """Parse `hybridserve ARGV` as the app would, without running it: an unknown command or option raises."""
    group = _cli()
    ctx = group.context_class(group, info_name="hybridserve")
    cmd, name, rest = group, "hybridserve", list(argv)
    while hasattr(cmd, "commands"):
        name, rest = rest[0], rest[1:]
        cmd = cmd.get_command(ctx, name)
        assert cmd is not None, f"hybridserve has no command {name!r}: {argv}"
    cmd.make_context(name, rest, parent=ctx)


def _stages() -> list[str]:
    text = RUNNER.read_text()
    body = text[text.index('case "$stage" in'):]
    body = body[:body.index("\nesac")]
    return [s for line in body.splitlines()[1:] if (m := re.match(r"\s*([\w|-]+)\)", line)) for s in m.group(1).split("|")]


def test_the_first_40_lines_hold_the_current_numbers_table() -> None:
    rows = _rows()
    assert len(rows) >= len(QUESTIONS)
    for question in QUESTIONS:
        assert any(row["question"].startswith(question) for row in rows), question
    for row in rows:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}|pending", row["date"]), row
        assert row["value"] and row["machine"], row
        if row["date"] == "pending":
            assert "pending H200 run" in row["value"], row


def test_the_file_fits_a_few_screens_and_its_full_record_and_history_are_files_of_their_own() -> None:
    assert len(TEXT.encode()) < 30_000
    assert "benchmarks/DETAILS.md" in TEXT and "benchmarks/HISTORY.md" in TEXT
    assert (ROOT / "benchmarks" / "DETAILS.md").is_file()


# what made a served row a configuration no user runs (issue 38): eager, Triton's GDN prefill forced, 8 sequences
NOT_AS_USERS_SERVE = re.compile(r"--enforce-eager|enforce_eager|gdn-prefill-backend triton|Triton's GDN prefill|"
                                r"max-num-seqs 8\b|\b8 sequences")


def test_no_current_row_ran_a_configuration_no_user_runs() -> None:
    dated = [row for row in _rows() if row["date"] != "pending"]
    assert [row["question"] for row in dated if NOT_AS_USERS_SERVE.search(row["value"])] == []
    served = [row for row in dated if row["question"].startswith("served P/D under load, H200")]
    assert served and "served as users serve" in served[0]["value"]
    assert NOT_AS_USERS_SERVE.search("ran `--enforce-eager`, Triton's GDN prefill, 8 sequences per engine")


def _stage_texts(stage: str, tmp_path: Path) -> dict[str, str]:
    """A stage's dry run and the benchmarks/ scripts it runs, by name."""
    done = _dry(stage, out=tmp_path)
    scripts = sorted(set(re.findall(r"benchmarks/\w+\.py", done.stdout)))
    return {"dry run": done.stdout, **{script: (ROOT / script).read_text() for script in scripts}}


def test_no_dated_gpu_row_comes_from_a_stage_that_serves_as_no_user_serves(tmp_path) -> None:
    gpu_rows = [row for row in _rows() if row["date"] != "pending" and re.search(r"H[12]00", row["machine"])]
    stages = [(row["question"], m) for row in gpu_rows
              for m in re.findall(r"bash benchmarks/h200\.sh ([\w-]+)", row["command"])]
    assert stages  # kernels, transfer, dead-peer, ...
    found = [(question, stage, name, m.group(0)) for question, stage in stages
             for name, text in _stage_texts(stage, tmp_path).items() for m in NOT_AS_USERS_SERVE.finditer(text)]
    assert found == []
    assert "benchmarks/served_pd.py" in _stage_texts("serve", tmp_path)  # the check reads the scripts a stage runs


def test_each_rows_command_names_a_script_or_a_hybridserve_command_that_exists() -> None:
    commands, stages = _cli().commands, _stages()
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
    for row in _rows():
        named = 0
        for piece in re.findall(r"`([^`]+)`", row["command"]):
            for path in re.findall(r"(?:benchmarks|scripts)/[\w./-]+|\.ci/\w+", piece):
                assert (ROOT / path).is_file(), (row["question"], path)
                named += 1
            if m := re.match(r"bash benchmarks/h200\.sh ([\w-]+)", piece):
                assert m.group(1) in stages, (row["question"], piece)
            if m := re.match(r"hybridserve ([\w-]+)(?: ([\w-]+))?", piece):
                cmd = commands.get(m.group(1))
                assert cmd is not None, (row["question"], piece)
                if hasattr(cmd, "commands"):
                    assert m.group(2) in cmd.commands, (row["question"], piece)
                named += 1
            if m := re.match(r"make ([\w-]+)", piece):
                assert m.group(1) in targets, (row["question"], piece)
                named += 1
        assert named, f"row {row['question']!r} names no script or command: {row['command']}"


def _history_entries() -> list[str]:
    """The items of HISTORY.md's index, each joined from its wrapped lines."""
    index = HISTORY[HISTORY.index("\n## Index\n"):]
    index = index[:index.index("\n## ", 1)]
    entries: list[str] = []
    for line in index.splitlines():
        if line.startswith("- "):
            entries.append(line[2:])
        elif line.startswith("  ") and entries:
            entries[-1] += " " + line.strip()
    return entries


def test_each_rows_details_is_a_section_and_history_entries_name_commits_that_exist() -> None:
    for row in _rows():
        assert row["details"] in HEADINGS, row
    lines = _history_entries()
    assert len(lines) >= 20
    for line in lines:
        commits = re.findall(r"\b([0-9a-f]{7,40})\b", line)
        assert commits, line
        for commit in commits:
            done = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True)
            assert done.returncode == 0, (commit, line)


def test_no_file_under_benchmarks_is_named_for_a_work_item() -> None:
    found = []
    for path in (ROOT / "benchmarks").rglob("*"):
        for part in path.relative_to(ROOT / "benchmarks").parts:
            words = re.split(r"[_.-]", part.lower())
            found += [str(path) for w in words if WORK_ITEM.search(w) and not MEASURED_NAMES.match(w)]
    assert found == []
    assert WORK_ITEM.search("gpu13") and WORK_ITEM.search("issue13") and WORK_ITEM.search("gpu_chain".split("_")[1])
    assert MEASURED_NAMES.match("h200") and MEASURED_NAMES.match("run3b")


def test_each_script_names_its_command_and_the_section_it_feeds() -> None:
    files = sorted(p for p in (ROOT / "benchmarks").iterdir() if p.suffix in (".py", ".sh"))
    scripts = [p for p in files if not p.name.startswith("_")]
    assert scripts
    for helper in (p for p in files if p.name.startswith("_")):  # imported by scripts, never run: used by one
        assert any(f"from {helper.stem} import" in p.read_text() for p in scripts), f"{helper.name}: no script uses it"
    for path in scripts:
        head = " ".join(line.lstrip("# ") for line in path.read_text().splitlines()[:4])
        m = re.search(r'BENCHMARKS\.md, "([^"]+)"', head)
        assert m, f"{path.name}: its first lines name no BENCHMARKS.md section"
        assert m.group(1) in HEADINGS, (path.name, m.group(1))
        if path.suffix == ".py":
            assert f"benchmarks/{path.name}" in path.read_text().split('"""')[1], f"{path.name}: no usage line"


def test_each_run_that_left_the_current_table_says_why() -> None:
    left = HISTORY[HISTORY.index("\n## Left the current table"):]
    sections = re.split(r"\n### ", left)[1:]
    assert len(sections) >= 6
    assert [s.splitlines()[0] for s in sections if "**Why it left the current table:**" not in s] == []


def test_every_runner_stage_is_documented() -> None:
    undocumented = [s for s in _stages() if not re.search(rf"h200\.sh {re.escape(s)}\b|`{re.escape(s)}`", TEXT)]
    assert undocumented == []


def test_no_runner_stage_is_a_single_letter_and_the_four_measurements_are_stages() -> None:
    stages = _stages()
    assert {"kernels", "transfer", "serve", "validate"} <= set(stages)
    assert [s for s in stages if len(s) == 1] == [] and "*" not in stages


def _dry(stage: str, *args: str, out: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HYBRIDSERVE_DRY="1", OUT=str(out))
    return subprocess.run(["bash", str(RUNNER), stage, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=30)


@pytest.mark.parametrize("stage", [s for s in _stages() if s != "copy-bundle"])
def test_each_stage_runs_scripts_and_cli_options_that_exist(stage, tmp_path) -> None:
    done = _dry(stage, out=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    commands = [line.split(": ", 1)[1] for line in done.stdout.splitlines() if line.startswith(("run: ", "start: "))]
    assert commands, done.stdout
    assert list(tmp_path.iterdir()) == [], "a dry run wrote results"
    for line in commands:
        argv = shlex.split(line.rsplit(" > ", 1)[0])
        while argv[0] in ("env", "setsid", "-w") or "=" in argv[0]:
            argv = argv[1:]
        if argv[0] == "hybridserve":
            _parse_cli(argv[1:])
        elif argv[0] == "nvidia-smi":  # a sampler of the GPU's memory beside a run
            assert "--format=csv,noheader,nounits" in argv, line
        elif argv[:3] == ["python3", "-m", "hybridserve.core.proxy"]:  # the proxy alone (a second one, say)
            from hybridserve.core.proxy.__main__ import parse_args

            parse_args(argv[3:])
        else:
            assert argv[0] == "python3" and (ROOT / argv[1]).is_file(), line
            if argv[1] == "benchmarks/kernels_h200.py":
                _kernels_parser().parse_args(argv[2:])


def _kernels_parser():  # noqa: ANN202
    import importlib.util

    spec = importlib.util.spec_from_file_location("kernels_h200", ROOT / "benchmarks" / "kernels_h200.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.parser()


def test_a_stage_passes_its_flags_on_and_a_wrong_stage_or_bundle_is_refused(tmp_path) -> None:
    done = _dry("serve", "--out", "/x/y", out=tmp_path)
    assert "benchmarks/served_pd.py --out /x/y" in done.stdout
    assert "--tp 1 2" in _dry("kernels", "--tp", "1", "2", out=tmp_path).stdout
    wrong = _dry("k", out=tmp_path)
    assert wrong.returncode == 2 and "kernels" in wrong.stdout and "'k'" in wrong.stdout
    assert _dry("copy-bundle", "wheels", str(tmp_path), out=tmp_path).returncode == 2
    assert _dry("copy-bundle", "nixl", str(tmp_path / "absent"), out=tmp_path).returncode == 2
    assert f"copy: {tmp_path} -> /tmp/nxstash" in _dry("copy-bundle", "nixl", str(tmp_path), out=tmp_path).stdout


def test_the_cli_parser_check_catches_a_typo() -> None:
    _parse_cli(["transfer", "bench", "-m", "qwen3.5-0.8b", "--memory", "vram", "--json"])
    with pytest.raises(Exception, match="No such option: --memroy"):
        _parse_cli(["transfer", "bench", "-m", "qwen3.5-0.8b", "--memroy", "vram"])
    with pytest.raises(AssertionError):
        _parse_cli(["benchh", "--json"])


def test_the_served_records_load_is_warmed_with_its_own_shapes_first():
    """served_h200.py runs the load's prompts once on each engine, uncounted, before measuring it (2026-12-05's first
    load on each engine had TTFT p90 4-5x the second's)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("served_h200", ROOT / "benchmarks/served_h200.py")
    served = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(served)
    for smoke in (False, True):
        load = served.profile(smoke)["load"]
        warm = dict(zip(*[iter(served.warm_load(load))] * 2))
        flags = dict(zip(load[::2], load[1::2]))
        assert warm["--input-len"] == flags["--input-len"] and warm["--concurrency"] == flags["--concurrency"]
        assert warm["--num-requests"] == flags["--concurrency"] and "--probes" not in warm
        assert warm["--prompt-seed"] not in {str(100 + i) for i in range(8)}  # not the measured prompts


def test_the_served_records_deployments_bind_distinct_ports_below_rays_worker_range(tmp_path, monkeypatch):
    """All of served_h200.py's deployments run at once on one machine: no two may share a port, and none may sit in
    Ray's worker port range (10,002 and up by default), where the `ray` deployment's workers bind at random. The ray
    deployment is launch's own P/D topology started with `--engine ray`."""
    import yaml

    served, prof = _served_h200_cuda_profile(tmp_path / "m60")
    monkeypatch.setattr(served, "STATE", tmp_path)
    ports: list[int] = []
    for name in served.PD_SHAPES:
        argv = served.launch_argv(name, prof)
        assert ("--engine" in argv) == (name == "ray"), argv
        topo = yaml.safe_load((tmp_path / f"{name}.yaml").read_text())
        roles = [topo["proxy"], *topo["prefill"], *topo["decode"]]
        found = [r["port"] for r in roles] + [r["side_channel_port"] for r in roles if "side_channel_port" in r]
        if name == "pd-ipc-cache":  # pd's own prefill, proxy and first decode, plus its second decode
            found = [r["port"] for r in topo["decode"][1:]] + [r["side_channel_port"] for r in topo["decode"][1:]]
        ports += found
    ports += [8001, 8002]  # SIDE_PROXIES
    for name in ("single", "single-b", "single-sync", "single-prof"):
        argv = served.launch_argv(name, prof)
        base = int(argv[argv.index("--base-port") + 1])
        ports += [base, base + 200]  # launch --role single: the engine at base + 200
    assert len(ports) == len(set(ports)), sorted(p for p in ports if ports.count(p) > 1)
    assert all(p < 10_002 for p in ports), sorted(ports)


def test_the_profile_totals_are_read_from_torchs_table_footer(tmp_path):
    """served_h200.py's single-prof keeps vLLM's key_averages table; its footer's units are torch's (s, ms, us)."""
    served, prof = _served_h200_cuda_profile(tmp_path / "m60")
    table = "Name  Self CPU %\n-----\nSelf CPU time total: 1.250s\nSelf CUDA time total: 56.700ms\n"
    assert served.profile_totals(table) == {"self_cpu_total_ms": 1250.0, "self_cuda_total_ms": 56.7}
    assert served.profile_totals("Self CPU time total: 980.000us\n") == {"self_cpu_total_ms": 0.98,
                                                                         "self_cuda_total_ms": None}
    argv = served.launch_argv("single-prof", prof)
    flag = next(a for a in argv if a.startswith("--vllm-arg=--profiler-config="))
    assert '"profiler":"torch"' in flag and '"ignore_frontend":true' in flag
