"""Timeouts, close() and break stop the reads in flight, and nothing is read again.

A :class:`stores.HangStore` never answers a chunk read, as a dead object store
would not; the process must still stop promptly.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from stores import HangStore

import daskzarr_batches as dzb

TESTS = Path(__file__).resolve().parents[1]  # tests/, where stores.py is


def hanging(tmp_path: Path) -> tuple[zarr.Array, HangStore]:
    z = zarr.create_array(tmp_path / "x.zarr", shape=(64, 2), chunks=(8, 2), dtype="f4")
    z[:] = np.ones((64, 2), dtype="f4")
    store = HangStore(zarr.storage.LocalStore(tmp_path / "x.zarr", read_only=True))
    return zarr.open_array(store=store, mode="r"), store


def settled(state: dict[str, int], seconds: float = 2.0) -> dict[str, int]:
    """``state`` once no read is in flight (or after ``seconds``)."""
    deadline = time.monotonic() + seconds
    while state["now"] and time.monotonic() < deadline:
        time.sleep(0.01)
    return dict(state)


@pytest.mark.parametrize(
    "make",
    [
        lambda x: dzb.batch_stream(x, 4, timeout=0.5),
        lambda x: dzb.shuffled_batch_stream(x, 4, seed=0, shuffle_buffer_size=16, timeout=0.5),
        lambda x: dzb.chunk_stream(x, timeout=0.5),
        lambda x: dzb.chunk_stream(x, ordered=False, timeout=0.5),
    ],
    ids=["sequential", "buffered", "chunks", "unordered chunks"],
)
def test_a_timeout_cancels_the_reads_in_flight_and_issues_none_again(
    tmp_path: Path, make: object
) -> None:
    x, store = hanging(tmp_path)
    stream = make(x)  # type: ignore[operator]
    with pytest.raises(dzb.WindowTimeoutError):
        next(stream)
    state = settled(store.state)
    assert state["now"] == 0 and state["cancelled"] >= 1
    time.sleep(0.3)
    assert store.state["gets"] == state["gets"], "a read was issued after the stream stopped"


def test_close_from_another_thread_stops_a_hung_next(tmp_path: Path) -> None:
    x, store = hanging(tmp_path)
    stream = dzb.batch_stream(x, 4)  # no timeout: next() would wait forever
    outcome: list[object] = []
    consumer = threading.Thread(target=lambda: outcome.append(next(stream, "exhausted")))
    consumer.start()
    time.sleep(0.3)
    stream.close()
    consumer.join(5)
    assert not consumer.is_alive() and outcome == ["exhausted"]
    assert settled(store.state)["now"] == 0


def test_break_cancels_the_windows_prefetched(tmp_path: Path) -> None:
    z = zarr.create_array(tmp_path / "x.zarr", shape=(64, 2), chunks=(8, 2), dtype="f4")
    z[:] = 1
    slow = HangStore(zarr.storage.LocalStore(tmp_path / "x.zarr", read_only=True))
    x = zarr.open_array(store=slow, mode="r")
    stream = dzb.chunk_stream(x, concurrency=4, timeout=0.2)
    with pytest.raises(dzb.WindowTimeoutError):
        for _ in stream:
            break
    assert settled(slow.state)["now"] == 0


SCRIPT = """
import sys, time
sys.path.insert(0, {tests!r})
import numpy as np, zarr
import daskzarr_batches as dzb
from stores import HangStore
z = zarr.create_array({path!r}, shape=(64, 2), chunks=(8, 2), dtype="f4")
z[:] = 1
x = zarr.open_array(store=HangStore(zarr.storage.LocalStore({path!r}, read_only=True)), mode="r")
started = time.monotonic()
try:
    {action}
except dzb.WindowTimeoutError:
    print("timed out", round(time.monotonic() - started, 2), flush=True)
"""


@pytest.mark.parametrize(
    "action",
    [
        "next(dzb.batch_stream(x, 4, timeout=1))",
        "next(dzb.shuffled_batch_stream(x, 4, seed=0, timeout=1))",
        "list(dzb.map_chunks(np.sum, x, timeout=1))",
        "s = dzb.batch_stream(x, 4, prefetch=3); s._runner.submit  # reads start on next()\n"
        "    import threading; threading.Timer(0.5, s.close).start(); print(next(s, 'closed'))",
    ],
    ids=["batch timeout", "exact timeout", "map_chunks timeout", "close while hung"],
)
def test_the_process_exits_promptly_when_the_store_never_answers(
    tmp_path: Path, action: str
) -> None:
    code = SCRIPT.format(tests=str(TESTS), path=str(tmp_path / "x.zarr"), action=action)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-2000:]
    assert "timed out" in done.stdout or "closed" in done.stdout
    assert elapsed < 15, f"the process took {elapsed:.1f} s to exit"
