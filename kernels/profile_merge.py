"""Merge tuned profiles timed in separate processes (FlashQLA's environment cannot hold FlashInfer's, and the
other way round) into one: per bucket, the union of the settings, re-ranked by each setting's pass-1 time.

Only profiles of the same GPU, model, dtype and rank metric merge. Settings timed in different processes were
timed at different moments; the merged profile records the sources' versions side by side ("a | b") where they
differ, so nobody mistakes it for one run.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from hybridserve.core.common.errors import InputError
from hybridserve.kernels import registry
from hybridserve.kernels.summary import closest_vllm_setting
from hybridserve.kernels.tuned_profile import TunedEntry, TunedProfile

_MUST_AGREE = ("gpu", "device", "model", "dtype", "rank_by")


def merge_profiles(profiles: list[tuple[str, TunedProfile]]) -> TunedProfile:
    """`profiles`: (name for messages, profile) pairs, at least two."""
    if len(profiles) < 2:
        raise InputError("--merge: accepted: two or more tuned profiles")
    (first_name, first), rest = profiles[0], profiles[1:]
    for name, p in rest:
        for attr in _MUST_AGREE:
            if getattr(p, attr) != getattr(first, attr):
                raise InputError(f"--merge: {attr} differs: {first_name} has {getattr(first, attr)!r}, {name} has "
                                 f"{getattr(p, attr)!r}; accepted: profiles of one GPU, model, dtype and rank metric")
    buckets: dict[tuple[int, int, int], TunedEntry] = {}
    for _, p in profiles:
        for e in p.entries:
            key = (e.tp, e.num_seqs, e.seq_len)
            buckets[key] = _merge_entry(buckets[key], e) if key in buckets else e
    entries = tuple(buckets[k] for k in sorted(buckets))
    vllm_setting, vllm_times = closest_vllm_setting(list(entries), tuple(registry.select(None)))
    return replace(first, entries=entries, versions=_versions([p.versions for _, p in profiles]),
                   vllm_gdn_prefill_backend=vllm_setting, vllm_setting_geomean_ms=vllm_times,
                   created_utc=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))


def _merge_entry(a: TunedEntry, b: TunedEntry) -> TunedEntry:
    if (a.num_key_heads, a.num_value_heads) != (b.num_key_heads, b.num_value_heads):
        raise InputError(f"--merge: TP{a.tp} {a.num_seqs}x{a.seq_len}: heads {a.num_key_heads}/{a.num_value_heads} "
                         f"vs {b.num_key_heads}/{b.num_value_heads}; accepted: profiles of one model")
    first_pass = {**a.first_pass_ms, **b.first_pass_ms}
    by_label = {c.label: c for c in a.ranked + b.ranked}
    ranked = tuple(sorted(by_label.values(), key=lambda c: first_pass.get(c.label, float("inf"))))
    times = {**a.times_ms, **b.times_ms}
    winner = ranked[0]
    timed_backends = {c.backend for c in ranked}
    rejected = {k: v for k, v in {**a.rejected, **b.rejected}.items()  # a backend missing in one process only
                if k not in by_label and k not in timed_backends}
    return replace(
        a, winner=winner, winner_ms=times[winner.label], best_ms=min(times.values()),
        fla_ms=a.fla_ms if a.fla_ms is not None else b.fla_ms,
        flashinfer_auto_ms=a.flashinfer_auto_ms if a.flashinfer_auto_ms is not None else b.flashinfer_auto_ms,
        times_ms={c.label: times[c.label] for c in ranked},
        first_pass_ms={c.label: first_pass[c.label] for c in ranked},
        host_ms={**a.host_ms, **b.host_ms}, latency_ms={**a.latency_ms, **b.latency_ms},
        first_call_ms={**a.first_call_ms, **b.first_call_ms}, rejected=rejected, ranked=ranked,
    )


def _versions(all_versions: list[dict[str, str]]) -> dict[str, str]:
    merged: dict[str, list[str]] = {}
    for versions in all_versions:
        for dist, version in versions.items():
            if version not in merged.setdefault(dist, []):
                merged[dist].append(version)
    return {dist: " | ".join(vs) for dist, vs in merged.items()}
