"""The claims' liveness: the heartbeat thread that renews the leases a store holds, and the check
that a lease's holder still runs, for `index.Store`. The claims themselves (their SQL) stay in `index`."""

from __future__ import annotations

import logging
import os
import socket
import threading
import weakref
from typing import Any

log = logging.getLogger(__name__)


def heartbeat(store_ref: "weakref.ref[Any]", every: float, gone: threading.Event) -> None:
    """Renews the leases a store holds, until the store is gone (it holds no reference to it between beats)."""
    while not gone.wait(every):
        store = store_ref()
        if store is None:
            return
        with store._lock:
            keys = list(store._held)
        if keys:
            try:
                store.renew(keys)
            except Exception as exc:  # a missed renewal risks duplicate work, not wrong results
                log.warning("could not renew cache claims: %s", exc)
        del store


def holder_alive(owner: str) -> bool:
    """False only when the holder ran on this host and its process is gone."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
