"""No thread can hold the process hostage: a read that never returns does not block the exit.

A chunk file replaced by a FIFO blocks the thread that opens it until a writer
appears, as a hung network file system blocks a read: nothing on the event
loop can cancel that thread.  Each test runs a child process whose read hangs
so, stops it (a timeout, ``close()``, SIGINT) and checks that the child exits
within a few seconds, with Zarr's codec pipeline and with zarrs.  The child is
killed if it outlives its budget, and the FIFO goes with ``tmp_path``.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Seconds from the stop (timeout, close, SIGINT) to the child's exit.
EXIT_WITHIN = 5.0
#: Seconds a child may live at all (start-up on a loaded 2-core machine included).
CHILD_BUDGET = 30.0

CHILD = """
import os, sys, threading, time
import numpy as np, zarr
import daskzarr_batches as dzb
from daskzarr_batches.store.pipelines import codec_pipeline_of
from daskzarr_batches.store.sources import as_source

path, pipeline, action = sys.argv[1:4]
z = zarr.create_array(path, shape=(64, 2), chunks=(8, 2), dtype="f4")
z[:] = 1
chunk = os.path.join(path, "c", "1", "0")
os.remove(chunk)
os.mkfifo(chunk)  # opening it for reading blocks until a writer comes: never
x = dzb.open_array(path, codec_pipeline=pipeline)
assert codec_pipeline_of(as_source(x, "x").array) == pipeline

def stopped(what):
    sys.stdout.write(f"stopped {what} {time.time()}\\n")  # one write: a thread may print too
    sys.stdout.flush()

try:
    if action == "timeout":
        list(dzb.batch_stream(x, 4, timeout=1))
    elif action == "chunk timeout":
        list(dzb.chunk_stream(x, timeout=1))
    elif action == "map_chunks timeout":
        list(dzb.map_chunks(np.sum, x, timeout=1))
    elif action == "close":
        stream = dzb.batch_stream(x, 4)
        def close():
            stream.close()
            stopped("close")
        threading.Timer(1, close).start()
        count = len(list(stream))
        print(f"batches {count}", flush=True)  # one write: the timer thread prints too
    elif action == "capacity":  # more stuck reads than Zarr has I/O threads, then a clean read
        for _ in range(min(32, (os.cpu_count() or 1) + 4) + 2):
            try:
                list(dzb.batch_stream(x, 4, timeout=0.3))
            except dzb.WindowTimeoutError:
                pass
        clean = zarr.create_array(path + ".clean", shape=(64, 2), chunks=(8, 2), dtype="f4")
        clean[:] = 2
        clean = dzb.open_array(path + ".clean", codec_pipeline=pipeline)
        print("clean sum", sum(float(b.sum()) for b in dzb.batch_stream(clean, 4, timeout=5)))
        stopped("capacity")
    elif action == "cluster timeout":  # the worker's one thread blocks on the FIFO
        from distributed import Client, LocalCluster
        cluster = LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None)
        client = Client(cluster)
        try:
            list(dzb.chunk_stream(x, timeout=1, client=client))
        except dzb.WindowTimeoutError as error:
            print("message", error, flush=True)
            raise
    elif action == "sigint":
        stream = dzb.batch_stream(x, 4)  # no timeout: only the user can stop it
        print("ready", flush=True)
        list(stream)  # KeyboardInterrupt goes up uncaught, as in a training script
except dzb.WindowTimeoutError:
    stopped("timeout")
"""


def run_child(tmp_path: Path, pipeline: str, action: str) -> tuple[float, str, str]:
    """Seconds between the child's stop and its exit; its stdout and stderr."""
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CHILD), str(tmp_path / "x.zarr"), pipeline, action],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        sent = None
        if action == "sigint":
            wait_for_line(child, "ready", time.monotonic() + CHILD_BUDGET)
            time.sleep(1.0)  # the reads are in flight, one of them stuck on the FIFO
            child.send_signal(signal.SIGINT)
            sent = time.time()
        try:
            out, err = child.communicate(timeout=CHILD_BUDGET)
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
            pytest.fail(f"the child never exited after {action} ({pipeline}): {out}{err[-2000:]}")
        exited = time.time()
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    if sent is None:
        stops = re.findall(r"stopped [a-z ]+? ([0-9]+\.[0-9]+)", out)
        assert stops, f"the child never stopped its read: {out}{err[-2000:]}"
        sent = float(stops[-1])
    return exited - sent, out, err


def wait_for_line(child: subprocess.Popen[str], text: str, deadline: float) -> None:
    """Read the child's stdout until a line holding ``text`` (fail at ``deadline``)."""
    assert child.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(child.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if selector.select(timeout=deadline - time.monotonic()):
                line = child.stdout.readline()
                if text in line:
                    return
                if not line:
                    break  # the child ended
    child.kill()
    _, err = child.communicate()
    pytest.fail(f"the child never printed {text!r}: {err[-2000:]}")


@pytest.mark.parametrize("pipeline", ["zarr", "zarrs"])
@pytest.mark.parametrize(
    "action", ["timeout", "chunk timeout", "map_chunks timeout", "close", "sigint"]
)
def test_the_process_exits_promptly_when_a_read_never_returns(
    tmp_path: Path, pipeline: str, action: str
) -> None:
    seconds, out, err = run_child(tmp_path, pipeline, action)
    assert seconds < EXIT_WITHIN, f"the child took {seconds:.1f} s to exit: {out}{err[-2000:]}"
    if action == "sigint":
        assert "KeyboardInterrupt" in err, err[-2000:]
    elif action == "close":
        assert "batches 2" in out, out  # the batches before the stuck chunk, then the end


def test_on_a_cluster_the_timeout_names_the_blocked_worker_thread(tmp_path: Path) -> None:
    """distributed cannot stop a running task: the error says so, and the client still exits."""
    seconds, out, err = run_child(tmp_path, "zarr", "cluster timeout")
    assert "worker thread stays blocked" in out and "client.restart()" in out, out
    assert seconds < EXIT_WITHIN, f"the child took {seconds:.1f} s to exit: {out}{err[-2000:]}"


@pytest.mark.parametrize("pipeline", ["zarr", "zarrs"])
def test_a_timed_out_read_does_not_take_a_thread_for_good(tmp_path: Path, pipeline: str) -> None:
    """After more stuck reads than Zarr has I/O threads, a clean array still reads."""
    seconds, out, err = run_child(tmp_path, pipeline, "capacity")
    assert "clean sum 256.0" in out, out + err[-2000:]
    assert seconds < EXIT_WITHIN, f"the child took {seconds:.1f} s to exit: {out}{err[-2000:]}"


def test_daemon_executor_threads_do_not_join_the_exit_and_abandon_on_cancel() -> None:
    """One thread, blocked: cancelling its call lets queued work run on a new thread."""
    import concurrent.futures.thread
    import threading

    from daskzarr_batches.errors import WindowError
    from daskzarr_batches.store.threads import DaemonExecutor

    release = threading.Event()
    for abandon in (False, True):
        pool = DaemonExecutor(1, "dzb-test", abandon=abandon)
        stuck = pool.submit(release.wait, 30)
        queued = pool.submit(threading.current_thread)
        time.sleep(0.05)
        assert stuck.running() and not queued.done()
        assert stuck.cancel() is False  # a running call cannot be cancelled ...
        if abandon:  # ... but its thread is let go: the queued call gets another
            worker = queued.result(timeout=5)
            assert worker.daemon and worker not in concurrent.futures.thread._threads_queues
        else:  # the stdlib pool's behaviour: the queued call waits for the thread
            time.sleep(0.2)
            assert not queued.done()
        release.set()
        assert stuck.result(timeout=5) is True and queued.result(timeout=5).daemon
        release.clear()
        pool.shutdown()
        with pytest.raises(WindowError):
            pool.submit(int)


def test_zarr_loop_runs_zarr_io_on_the_daemon_executor() -> None:
    from daskzarr_batches.store.threads import io_executor, zarr_loop

    loop = zarr_loop()
    assert loop._default_executor is io_executor()  # type: ignore[attr-defined]
    assert zarr_loop() is loop
