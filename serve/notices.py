"""One warning per key and process, for the serving paths that fall back (Inductor's private APIs moved, a model
that cannot decide): said once, not at every compile."""
from __future__ import annotations

import threading
import warnings

_lock = threading.Lock()
_warned: set[str] = set()  # guarded by _lock


def warn_once(key: str, message: str, source: str = "perfmodel") -> None:
    """RuntimeWarning "source: message", the first time `key` is seen in this process."""
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(f"{source}: {message}", RuntimeWarning, stacklevel=3)
