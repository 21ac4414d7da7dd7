"""What a real ``distributed`` scheduler still holds of this library's work."""

from __future__ import annotations

import time
from typing import Any


def our_tasks(client: Any, settle: float = 5.0) -> list[str]:
    """Keys of library tasks (``dzb-*``) the scheduler still holds.

    Releases travel to the scheduler asynchronously, so this polls for up to
    ``settle`` seconds before returning what is left.
    """

    def keys(dask_scheduler: Any) -> list[str]:
        return [str(k) for k in dask_scheduler.tasks if "dzb-" in str(k)]

    deadline = time.monotonic() + settle
    while (left := client.run_on_scheduler(keys)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left
