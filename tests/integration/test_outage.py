"""Nothing on stderr but the error a user should see: each case runs in its own process.

A suspended ``Loader`` left at interpreter exit, a read that fails while it
is cancelled, sharded reads that fail for good, and a store deleted mid-epoch
(whose ``StoreGoneError`` is the one traceback expected) must print no
"Exception ignored", "Task exception was never retrieved" or other traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zarr

ROOT = Path(__file__).resolve().parents[2]

CASES = {
    # a stream's generator saw the stream through a weak proxy that the garbage
    # collector clears before finalizers run: ReferenceError at exit
    "a Loader left suspended at exit, in a reference cycle": """
        import daskzarr_batches as dzb
        it = iter(dzb.Loader(dzb.open_array(STORE, "x"), 16))
        next(it), next(it)
        cycle = [it]
        cycle.append(cycle)
    """,
    # the stream stopped waiting (cancel) and the read then failed: nobody took its error
    "a read that fails as it is cancelled": """
        import asyncio, gc, threading, time
        from daskzarr_batches.errors import ReadCancelledError
        from daskzarr_batches.execute.cancel import Cancellation

        async def read():
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                raise PermissionError("failed while cancelled")

        scope, seen = Cancellation(), []

        def wait():
            try:
                scope.run(read())
            except ReadCancelledError:
                seen.append("cancelled")

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.2)
        scope.cancel()
        thread.join()
        time.sleep(0.1)
        gc.collect()
        assert seen == ["cancelled"]
    """,
    "sharded buffered reads that fail for good": """
        import gc, zarr, zarr.storage
        import daskzarr_batches as dzb
        from stores import FaultStore

        memory = zarr.storage.MemoryStore()
        a = zarr.create_array(memory, shape=(256, 8), chunks=(4, 2), shards=(16, 4), dtype="f4")
        a[:] = 1
        bad = [f"c/{row}/{col}" for row in range(2, 16) for col in range(2)]
        x = zarr.open_array(FaultStore(memory, {k: [PermissionError("denied")] * 9 for k in bad}))
        try:
            list(dzb.shuffled_batch_stream(x, 8, seed=0, shuffle_buffer_size=64, prefetch=4))
        except dzb.ChunkReadError:
            pass
        gc.collect()
    """,
    "a store deleted mid-epoch": """
        import shutil
        import daskzarr_batches as dzb
        stream = dzb.batch_stream(dzb.open_array(STORE, "x"), 16, window_bytes=4096)
        next(stream)
        shutil.rmtree(STORE)
        list(stream)
    """,
}


@pytest.mark.parametrize("case", CASES)
def test_stderr_holds_only_the_expected_error(tmp_path: Path, case: str) -> None:
    store = tmp_path / "g.zarr"
    x = zarr.open_group(store, mode="w").create_array(
        "x", shape=(4000, 8), chunks=(256, 8), dtype="f4"
    )
    x[:] = np.ones((4000, 8), "f4")
    script = f"STORE = {str(store)!r}\n" + textwrap.dedent(CASES[case])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    err = done.stderr
    assert "Exception ignored" not in err and "never retrieved" not in err, err
    if case == "a store deleted mid-epoch":
        assert done.returncode == 1 and err.count("Traceback") == 1, err
        last = err.strip().splitlines()[-1]
        assert last.startswith("daskzarr_batches.errors.StoreGoneError: array "), err
    else:
        assert done.returncode == 0 and err == "", err
