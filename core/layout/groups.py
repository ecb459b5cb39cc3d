"""KV-cache groups and the shared tensors behind them (vLLM `_get_kv_cache_groups_uniform_page_size`)."""

from __future__ import annotations

from dataclasses import dataclass

from hybridserve.core.model.spec import LayerKind, ModelSpec
from hybridserve.core.common.arith import cdiv


@dataclass(frozen=True, kw_only=True)
class KVCacheGroup:
    kind: LayerKind
    layers: tuple[int, ...]  # model layer indices; fewer than group_size when the last group of a kind is padded


@dataclass(frozen=True, kw_only=True)
class GroupLayout:
    groups: tuple[KVCacheGroup, ...]
    group_size: int  # = number of shared tensors T

    @property
    def num_tensors(self) -> int:
        return self.group_size

    def tensor_layers(self, tensor: int) -> tuple[int, ...]:
        """Tensor j is shared by the j-th layer of every group (Qwen3.5: layers 4j..4j+3)."""
        return tuple(sorted(g.layers[tensor] for g in self.groups if tensor < len(g.layers)))

    def groups_of(self, kind: LayerKind) -> tuple[KVCacheGroup, ...]:
        return tuple(g for g in self.groups if g.kind is kind)


def group_layers(model: ModelSpec, *, hybrid_allocator: bool = True) -> GroupLayout:
    """Mirror vLLM's grouping with a uniform page size.

    Layers are bucketed by kind in order of first appearance. group_size = the smallest bucket, except when the
    largest is under 1.5x the smallest (then the largest). Each bucket of n layers splits into cdiv(n, group_size)
    groups; group i takes layers[i::num_groups]. Qwen3.5-397B: 45 GDN + 15 attention -> 3 GDN groups + 1
    attention group of 15 layers, T = 15. Gemma-3-4b: 29 sliding + 5 full -> 6 sliding groups (the last holds
    4 layers) + 1 full group, T = 5. Without the hybrid allocator every layer is its own tensor in one group.
    """
    if not hybrid_allocator:
        return GroupLayout(groups=(KVCacheGroup(kind=LayerKind.FULL_ATTENTION,
                                                layers=tuple(range(model.num_layers))),),
                           group_size=model.num_layers)
    buckets: dict[LayerKind, list[int]] = {}
    for index, kind in enumerate(model.layer_kinds):
        buckets.setdefault(kind, []).append(index)
    sizes = [len(v) for v in buckets.values()]
    smallest, largest = min(sizes), max(sizes)
    group_size = largest if largest < 1.5 * smallest else smallest
    groups: list[KVCacheGroup] = []
    for kind, layers in buckets.items():
        num_groups = cdiv(len(layers), group_size)
        groups.extend(KVCacheGroup(kind=kind, layers=tuple(layers[i::num_groups])) for i in range(num_groups))
    return GroupLayout(groups=tuple(groups), group_size=group_size)
