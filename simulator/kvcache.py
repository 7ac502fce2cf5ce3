"""The KV cache of one instance: a pool of 16-token blocks with a prefix cache.

Full blocks of a shared prefix carry a hash (a hashable key, chained by position like vLLM's
block hashes). A hashed block stays resident after its last user frees it and can be hit by
the next request with the same prefix; resident unused blocks are evicted least recently used
first when new blocks are needed. Blocks of a request's own tokens are not cached (they could
only be hit by the same request after a preemption; vLLM may keep those, this model does not).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable


class BlockPool:
    """Blocks of one instance.

    Args:
        total: blocks of the instance's KV cache.
        prefix_caching: keep hashed blocks resident for reuse.
    """

    def __init__(self, total: int, prefix_caching: bool = True) -> None:
        self.total = total
        self.prefix_caching = prefix_caching
        self.reserved = 0  # blocks taken away by a kv_cache_pressure incident
        self.plain_used = 0
        self.refs: dict[Hashable, int] = {}  # resident hashed blocks -> users
        self.evictable: OrderedDict[Hashable, None] = OrderedDict()  # refs == 0, LRU first

    @property
    def free(self) -> int:
        """Blocks that can be handed out now (unused plus evictable cached blocks)."""
        return self.total - self.reserved - self.plain_used - len(self.refs) + len(self.evictable)

    @property
    def usable(self) -> int:
        """Blocks the engine may hold at all (what a kv_cache_pressure incident leaves)."""
        return self.total - self.reserved

    @property
    def usage(self) -> float:
        """vLLM's ``kv_cache_usage_perc``: 1 - free / total (reserved blocks count as used)."""
        return 1.0 - max(self.free, 0) / self.total if self.total else 0.0

    def lookup(self, keys: list[Hashable]) -> int:
        """Number of leading ``keys`` resident in the cache (the prefix hit, in blocks)."""
        if not self.prefix_caching:
            return 0
        hits = 0
        refs = self.refs
        for key in keys:
            if key not in refs:
                break
            hits += 1
        return hits

    def _make_room(self, n: int) -> bool:
        """Evict LRU cached blocks until ``n`` blocks are unowned; False if impossible."""
        unowned = self.total - self.reserved - self.plain_used - len(self.refs)
        if unowned >= n:
            return True
        if unowned + len(self.evictable) < n:
            return False
        evictable, refs = self.evictable, self.refs
        while unowned < n:
            key, _ = evictable.popitem(last=False)
            del refs[key]
            unowned += 1
        return True

    def acquire(self, hashed: list[Hashable], plain: int) -> bool:
        """Take blocks: ``hashed`` keys (shared if resident, else newly allocated and
        registered) plus ``plain`` unhashed blocks. All or nothing."""
        refs, evictable = self.refs, self.evictable
        resident = [k for k in hashed if k in refs]
        for key in resident:  # pin hits first so making room cannot evict them
            if refs[key] == 0:
                del evictable[key]
            refs[key] += 1
        new = len(hashed) - len(resident)
        if not self._make_room(new + plain):
            self.release(resident, 0)
            return False
        for key in hashed:
            if key not in refs:
                refs[key] = 1
        self.plain_used += plain
        return True

    def acquire_plain(self, n: int) -> bool:
        """Take ``n`` unhashed blocks (evicting cached ones if needed); all or nothing."""
        if self.total - self.reserved - self.plain_used - len(self.refs) < n and \
                not self._make_room(n):
            return False
        self.plain_used += n
        return True

    def release(self, hashed: list[Hashable], plain: int) -> None:
        """Give blocks back; hashed blocks stay resident (most recently used) when caching."""
        refs, evictable = self.refs, self.evictable
        for key in hashed:
            count = refs[key] - 1
            if count:
                refs[key] = count
            elif self.prefix_caching:
                refs[key] = 0
                evictable[key] = None
            else:
                del refs[key]
        self.plain_used -= plain

    def evict_all(self) -> None:
        """Drop every unused cached block (what a prefix-cache reset does)."""
        for key in self.evictable:
            del self.refs[key]
        self.evictable.clear()
