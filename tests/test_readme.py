"""The README and its guides under docs/ as a newcomer reads them: the README short, one example per command, where
the command is and how long `make test` takes; every example (README and guides) says how long it takes on a CPU or
that it needs a GPU, and none overwrites a file the repository ships; the README's measured figures equal
BENCHMARKS.md's current numbers; every relative link and anchor resolves, and nothing points into a README section
that moved to a guide."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
GUIDES = sorted((ROOT / "docs").glob("*.md"))
OUTPUT_OPTIONS = ("--out", "--plot", "--png", "--junit")
COMMANDS = ("plan", "verify", "tune", "launch", "validate", "bench", "transfer bench")


def _examples(text: str) -> list[tuple[str, str]]:
    """(example line, the block's first comment line or '') for every `hybridserve ...` line in bash blocks."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        lines = block.splitlines()
        header = lines[0] if lines and lines[0].startswith("#") else ""
        found += [(line, header) for line in lines if line.startswith("hybridserve ")]
    return found


def _all_examples() -> list[tuple[str, str]]:
    return _examples(README) + [e for path in GUIDES for e in _examples(path.read_text())]


def test_the_readme_is_short_and_has_one_example_per_command_and_a_guide_for_each():
    assert len(README.encode()) < 15_000
    examples = [line for line, _ in _examples(README)]
    for command in COMMANDS:
        assert [e for e in examples if e.startswith(f"hybridserve {command} ")], command
    guides = {path.name for path in GUIDES}
    assert {"install.md", "plan.md", "kernels.md", "launch.md", "validate.md", "bench.md", "transfer.md"} <= guides
    assert [name for name in guides if f"docs/{name}" not in README] == []  # every guide is linked from README


def test_every_example_says_its_cpu_time_or_that_it_needs_a_gpu():
    examples = _all_examples()
    assert len(examples) >= 30
    unlabeled = [line for line, header in examples
                 if not re.search(r"CPU|GPU", (line.split("#", 1)[1] if "#" in line else "") + header)]
    assert unlabeled == []


def test_no_example_writes_over_a_shipped_file():
    tracked = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split())
    written = []
    for line, _ in _all_examples():
        words = shlex.split(line.split("#", 1)[0])
        written += [words[i + 1] for i, word in enumerate(words[:-1]) if word in OUTPUT_OPTIONS]
    assert written, "the examples write no file at all: the check would see nothing"
    assert [path for path in written if path in tracked or (ROOT / path).exists()] == []


def test_the_readme_says_where_the_command_is_and_how_long_make_test_takes():
    assert "source .venv/bin/activate" in README and ".venv/bin/hybridserve" in README
    assert re.search(r"`make test` then takes about \d+ minutes", README)


# README's measured figures: the numbers of each block between these markers are all in BENCHMARKS.md's
# current-numbers table (its first 40 lines); outside the blocks README states no throughput (GB/s, MB/s, tok/s), the
# figures that go stale, and points to the table instead; nor do the guides under docs/.
FIGURES_START, FIGURES_END = "<!-- figures:", "<!-- end figures -->"
NUMBER = re.compile(r"(?<![\w.,])\d[\d,]*(?:\.\d+)?(?![\w,]*\d)")
THROUGHPUT = re.compile(r"\d[\d,.]*\s*(?:GB/s|MB/s|tok/s)")


def _figures_blocks() -> tuple[list[str], str]:
    blocks, rest, at = [], "", 0
    while (start := README.find(FIGURES_START, at)) >= 0:
        end = README.index(FIGURES_END, start)
        blocks.append(README[start:end])
        rest += README[at:start]
        at = end
    return blocks, rest + README[at:]


def _numbers(text: str) -> set[str]:
    return {m.group(0) for m in NUMBER.finditer(text)}


def test_every_number_of_the_readmes_figures_is_in_the_current_numbers_table():
    blocks, _ = _figures_blocks()
    assert len(blocks) == 2  # "Measured", and what P/D costs on one GPU
    table = "\n".join((ROOT / "BENCHMARKS.md").read_text().splitlines()[:40])
    numbers = set().union(*(_numbers(block.split("-->", 1)[1]) for block in blocks))
    # the check sees the headline figures, P/D's cost on one GPU among them
    assert {"0.284", "1.28", "1,230", "1,419", "1,195", "0.56", "0.99", "0.46", "0.58"} <= numbers
    assert sorted(n for n in numbers if n not in _numbers(table)) == []
    assert "BENCHMARKS.md#current-numbers" in blocks[0]


def test_what_pd_costs_on_one_gpu_says_why():
    blocks, _ = _figures_blocks()
    why = re.sub(r"\s+", " ", blocks[1])
    assert "time-slice" in why and "batches prefill chunks with decode" in why


def test_outside_its_figures_the_readme_states_no_throughput_nor_do_the_guides():
    _, rest = _figures_blocks()
    assert THROUGHPUT.findall(rest) == []
    assert {path.name: found for path in GUIDES if (found := THROUGHPUT.findall(path.read_text()))} == {}
    assert THROUGHPUT.findall("ours 1,230 GB/s and 7 tok/s") == ["1,230 GB/s", "7 tok/s"]


def test_number_matching_reads_ranges_and_thousands_whole():
    assert _numbers("1,230-1,419 GB/s, 0.1 %, 32k, 238-265 s, 2-core") == {"1,230", "1,419", "0.1", "32", "238",
                                                                          "265", "2"}


# Links: README, the guides, BENCHMARKS.md and the files under benchmarks/ link each other by relative path and
# heading anchor (GitHub's: lower case, punctuation but - and _ dropped, spaces to -).
LINKED = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *GUIDES, *sorted((ROOT / "benchmarks").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for path in LINKED:
        for target in LINK.findall(path.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in _anchors(dest)):
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert broken == []
    assert _anchor("transfer bench --memory vram, H200") == "transfer-bench---memory-vram-h200"
    assert _anchor("P/D on CPU: the plugin's fixes and the proxy") == "pd-on-cpu-the-plugins-fixes-and-the-proxy"


def test_nothing_points_into_a_readme_section_that_moved_to_a_guide():
    """"README, Install" and the like: those sections are guides under docs/ now."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    pattern = re.compile(r"README(?:\.md)?,\s+\"?[A-Z]|README's (?:launch|install|plan|validate|bench)\w* section")
    found = []
    for name in files:
        path = ROOT / name
        if path.suffix not in (".py", ".sh", ".md", ".toml", ".yaml", "") or not path.is_file():
            continue
        if name != "tests/test_readme.py":
            found += [f"{name}: {m.group(0)}" for m in pattern.finditer(path.read_text(errors="replace"))]
    assert found == []
    assert pattern.search("(README, Install)") and pattern.search("README's launch section gives")
