"""A bounded memory of results: what a run found or computed lately, kept so that asking again
(a duplicate row, the same photo under many captions) costs no second look-up in the store."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Mapping


class Recent(OrderedDict):
    """A mapping of at most `limit` entries: putting one past the limit forgets the one put longest ago."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def put(self, entries: Mapping[str, Any]) -> None:
        for key, value in entries.items():
            self[key] = value
            self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)
