"""The README's examples as a newcomer runs them: where the command is, how long each takes on a CPU (or that it
needs a GPU), how long `make test` takes, and no example that overwrites a file the repository ships; its measured
figures equal BENCHMARKS.md's current numbers."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
OUTPUT_OPTIONS = ("--out", "--plot", "--png", "--junit")


def _examples() -> list[tuple[str, str]]:
    """(example line, the block's first comment line or '') for every `hybridserve ...` line in bash blocks."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S):
        lines = block.splitlines()
        header = lines[0] if lines and lines[0].startswith("#") else ""
        found += [(line, header) for line in lines if line.startswith("hybridserve ")]
    return found


def test_every_example_says_its_cpu_time_or_that_it_needs_a_gpu():
    examples = _examples()
    assert len(examples) >= 12
    unlabeled = [line for line, header in examples
                 if not re.search(r"CPU|GPU", (line.split("#", 1)[1] if "#" in line else "") + header)]
    assert unlabeled == []


def test_no_example_writes_over_a_shipped_file():
    tracked = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split())
    written = []
    for line, _ in _examples():
        words = shlex.split(line.split("#", 1)[0])
        written += [words[i + 1] for i, word in enumerate(words[:-1]) if word in OUTPUT_OPTIONS]
    assert written, "the examples write no file at all: the check would see nothing"
    assert [path for path in written if path in tracked or (ROOT / path).exists()] == []


def test_the_readme_says_where_the_command_is_and_how_long_make_test_takes():
    assert "source .venv/bin/activate" in README and ".venv/bin/hybridserve" in README
    assert re.search(r"`make test` then takes about \d+ minutes", README)


# README's measured figures: the numbers of the block between these markers are all in BENCHMARKS.md's
# current-numbers table (its first 40 lines); outside the block README states no throughput (GB/s, MB/s, tok/s),
# the figures that go stale, and points to the table instead.
FIGURES_START, FIGURES_END = "<!-- figures:", "<!-- end figures -->"
NUMBER = re.compile(r"(?<![\w.,])\d[\d,]*(?:\.\d+)?(?![\w,]*\d)")
THROUGHPUT = re.compile(r"\d[\d,.]*\s*(?:GB/s|MB/s|tok/s)")


def _figures_block() -> tuple[str, str]:
    start = README.index(FIGURES_START)
    end = README.index(FIGURES_END, start)
    return README[start:end], README[:start] + README[end:]


def _numbers(text: str) -> set[str]:
    return {m.group(0) for m in NUMBER.finditer(text)}


def test_every_number_of_the_readmes_figures_is_in_the_current_numbers_table():
    block, _ = _figures_block()
    table = "\n".join((ROOT / "BENCHMARKS.md").read_text().splitlines()[:40])
    numbers = _numbers(block.split("-->", 1)[1])
    assert {"0.284", "1.28", "1,230", "1,419", "768"} <= numbers  # the check sees the headline figures
    assert sorted(n for n in numbers if n not in _numbers(table)) == []
    assert "BENCHMARKS.md#current-numbers" in block


def test_outside_its_figures_the_readme_states_no_throughput():
    _, rest = _figures_block()
    assert THROUGHPUT.findall(rest) == []
    assert THROUGHPUT.findall("ours 1,230 GB/s and 7 tok/s") == ["1,230 GB/s", "7 tok/s"]


def test_number_matching_reads_ranges_and_thousands_whole():
    assert _numbers("1,230-1,419 GB/s, 0.1 %, 32k, 238-265 s, 2-core") == {"1,230", "1,419", "0.1", "32", "238",
                                                                          "265", "2"}
