"""benchmarks/ttft_spread.py: the median TTFT ratio with its bootstrap interval, read from bench's per-request
records (a folder or a raw.tgz), as BENCHMARKS.md's idle rows quote it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "ttft_spread.py"


def _module():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("ttft_spread", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bench(path: Path, ttfts: list[float], *, probe: float | None = None) -> None:
    records = [{"ttft_s": t, "is_probe": False} for t in ttfts]
    if probe is not None:
        records.append({"ttft_s": probe, "is_probe": True})
    path.write_text(json.dumps({"targets": [{"phases": [{"records": records}]}]}))


def test_the_ratio_is_of_the_medians_and_probes_are_left_out(tmp_path) -> None:
    _bench(tmp_path / "bench_idle_1024_pd.json", [0.30, 0.20, 0.22, 0.21, 0.25], probe=9.0)
    _bench(tmp_path / "bench_idle_1024_single.json", [0.10, 0.11, 0.09, 0.50, 0.10])
    records = _module().read_records(tmp_path)
    assert records == {1024: {"pd": [0.30, 0.20, 0.22, 0.21, 0.25], "single": [0.10, 0.11, 0.09, 0.50, 0.10]}}
    ratio, low, high = _module().spread(records[1024]["pd"], records[1024]["single"], resamples=500, seed=3)
    assert ratio == 0.22 / 0.10
    assert low <= ratio <= high and low < high  # the samples vary: an interval, not a point


def test_identical_samples_give_one_with_no_spread_and_a_tgz_reads_like_a_folder(tmp_path) -> None:
    folder = tmp_path / "raw"
    folder.mkdir()
    for target in ("single", "single-b"):
        _bench(folder / f"bench_idle_8192_{target}.json", [0.15] * 10)
    with tarfile.open(tmp_path / "raw.tgz", "w:gz") as tar:
        tar.add(folder, arcname=".")
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "raw.tgz"), "--pairs", "single-b/single",
                           "--json"], capture_output=True, text=True, check=True)
    (row,) = json.loads(done.stdout)["rows"]
    assert (row["tokens"], row["pair"], row["ratio"], row["low"], row["high"]) == (8192, "single-b/single", 1, 1, 1)


def test_bad_input_is_one_line_and_exit_2(tmp_path) -> None:
    for argv in ([str(tmp_path / "none")], [str(tmp_path), "--pairs", "pd"], [str(tmp_path)]):
        done = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, argv
