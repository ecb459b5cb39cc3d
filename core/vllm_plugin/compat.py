"""Check the plugin's patches (manifest.py) against a vLLM's source before a server starts.

`check` returns one `Mismatch` per patch that cannot run there: a requested patch on a vLLM line it does not claim,
or a name it touches that the source does not define. Launch's preflight refuses on the first (exit 2, one line);
the plugin's `register()` does the same in the first vLLM process of a server started some other way, so a moved
name stops the server at start-up and never inside a request.

    python -m hybridserve.core.vllm_plugin.compat [--source DIR] [--json]   # every patch against a vLLM tree

(the H200 runs check vLLM 0.26 this way, in the run that injects the faults; the tests check the installed one).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from hybridserve.core.host.vllm_version import VllmVersion, installed_vllm, parse_minor
from hybridserve.core.vllm_plugin.manifest import ALL, PatchSpec
from hybridserve.core.vllm_plugin.source_index import SourceIndex

IndexFor = Callable[[str], "SourceIndex | None"]  # top-level package -> its source tree (None: not installed)


@dataclass(frozen=True, kw_only=True)
class Mismatch:
    patch: str
    supported: str  # "0.26, 0.32"
    version: str  # "vllm 0.26.0"
    missing: str  # what is not there

    @property
    def message(self) -> str:
        return (f"hybridserve plugin: patch {self.patch} (supports vLLM {self.supported}) cannot run on "
                f"{self.version}: {self.missing}")


def line_of(version: VllmVersion) -> str:
    major, minor = parse_minor(version.text)
    return f"{major}.{minor}"


def is_supported(spec: PatchSpec, line: str) -> bool:
    return spec.lines is None or line in spec.lines


def alternatives(attr: str) -> list[str]:
    """'Cls.a|b' -> ['Cls.a', 'Cls.b']: an alternative without a dot keeps the first one's class."""
    first, *rest = attr.split("|")
    owner = first.rpartition(".")[0]
    return [first, *(f"{owner}.{a}" if owner and "." not in a else a for a in rest)]


def missing_names(spec: PatchSpec, line: str, index_for: IndexFor) -> list[str]:
    missing = []
    for names in spec.names_for(line):
        index = index_for(names.module.split(".")[0])
        if index is None:  # the package is not installed: the patched module never loads, the patch never acts
            continue
        if index.module(names.module) is None:
            missing.append(f"no module {names.module}")
            continue
        missing += [f"no {a.split('|')[0]} in {names.module}" for a in names.attrs
                    if not any(index.has(names.module, alt) for alt in alternatives(a))]
    return missing


def check(specs: Iterable[PatchSpec], version: VllmVersion, index_for: IndexFor) -> list[Mismatch]:
    """The patches of `specs` that cannot run on `version` (always-on ones off their lines are left out, so skipped)."""
    line = line_of(version)
    found = []
    for spec in specs:
        supported = "any" if spec.lines is None else ", ".join(spec.lines)
        where = f"{version.distribution} {version.text}"
        if not is_supported(spec, line):
            if not spec.is_always_on:
                found.append(Mismatch(patch=spec.name, supported=supported, version=where,
                                      missing=f"line {line} is not one it was proven on"))
            continue
        found += [Mismatch(patch=spec.name, supported=supported, version=where, missing=m)
                  for m in missing_names(spec, line, index_for)]
    return found


def installed_index(package: str, cache: dict[str, SourceIndex | None] = {}) -> SourceIndex | None:  # noqa: B006
    if package not in cache:
        cache[package] = SourceIndex.installed(package)
    return cache[package]


def tree_index(root: Path) -> IndexFor:
    """Every package from one unpacked tree (e.g. a vLLM wheel): a package it lacks counts as not installed."""
    index = SourceIndex(root)
    return lambda package: index if (root / package).is_dir() else None


def report(specs: Sequence[PatchSpec], version: VllmVersion, index_for: IndexFor) -> dict:
    line = line_of(version)
    mismatches = check(specs, version, index_for)
    rows = [{"patch": s.name, "lines": s.lines, "is_always_on": s.is_always_on,
             "names": [a for n in s.names_for(line) for a in n.attrs], "is_supported": is_supported(s, line),
             "mismatches": [m.missing for m in mismatches if m.patch == s.name]} for s in specs]
    return {"version": asdict(version), "line": line, "patches": rows, "ok": not mismatches}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check every plugin patch's names against a vLLM source tree.")
    parser.add_argument("--source", type=Path, help="a folder holding vllm/ (default: the installed vLLM)")
    parser.add_argument("--version", help="its version, e.g. 0.26.0 (default: the installed one's)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    version = (VllmVersion(text=args.version, distribution="vllm") if args.version else installed_vllm())
    if version is None:
        print("no vLLM installed: give --source and --version", file=sys.stderr)
        return 2
    index_for = tree_index(args.source) if args.source else installed_index
    result = report(ALL, version, index_for)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for row in result["patches"]:
            state = "ok" if not row["mismatches"] else "; ".join(row["mismatches"])
            print(f"{row['patch']:32} {'supported' if row['is_supported'] else 'left out':10} {state}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
