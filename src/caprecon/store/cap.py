"""The size cap of a store given `max_size` (`--cache-max-size`): past it, the oldest entries are
deleted, values and picture files, down to `CAP_LOW_WATER` of the cap. `cache prune --max-size`
(`caprecon.store.maintenance.cache_prune`) deletes the oldest entries once, by hand."""

from __future__ import annotations

import logging

from caprecon.store.images import key_problem
from caprecon.store.sql import delete_results

log = logging.getLogger(__name__)

#: where the size cap prunes down to, as a share of the cap: room for a twentieth's writes, and more,
#: before the next prune (pruning to the cap itself would prune again at the next write)
CAP_LOW_WATER = 0.9


class SizeCap:
    """The size cap of `caprecon.store.index.Store`: the front's `_write_rows` reports each write's
    bytes (`_mind_cap`); the oldest entries go in one of the front's transactions."""

    def __init__(self) -> None:
        super().__init__()
        self._unchecked_bytes = 0  # written since the size cap was last enforced

    def _mind_cap(self, written: int) -> None:
        """Enforce the size cap once a twentieth of it has been written since the last time (the
        count of the store's bytes is one query; each write paying for it would slow every batch)."""
        with self._lock:
            self._unchecked_bytes += written
            due = self._unchecked_bytes * 20 >= self.max_size
            if due:
                self._unchecked_bytes = 0
        if due:
            self.enforce_cap()

    def enforce_cap(self) -> int:
        """Keep the store within `max_size`: when its entries (values and picture files) hold more
        bytes, delete the oldest until they hold at most `CAP_LOW_WATER` of it. Returns the entries
        deleted. A store given a cap runs this itself as it writes (`--cache-max-size`); `cache prune
        --max-size` deletes the oldest entries once, by hand, down to the size given."""
        if self.max_size is None or self.read_only:
            return 0
        with self.transaction() as db:
            # an image entry stored before sizes were recorded counts its record alone
            entries = [(key, (value_bytes or 0) + (file_size or 0)) for key, value_bytes, file_size in db.execute(
                "SELECT key, length(value), file_size FROM results ORDER BY created")]
            total = sum(size for _, size in entries)
            doomed = []
            if total > self.max_size:
                goal = self.max_size * CAP_LOW_WATER
                for key, size in entries:  # oldest first
                    if total <= goal:
                        break
                    doomed.append(key)
                    total -= size
                delete_results(db, doomed)
        for key in doomed:
            if key_problem(key) is None:  # a key no picture file can have, written by another program, has none
                self.image_path(key).unlink(missing_ok=True)
        if doomed:
            log.info("cache %s over its cap of %d bytes: %d oldest entries deleted", self.root, self.max_size,
                     len(doomed))
        return len(doomed)
