"""daskzarr_batches.jax on 8 CPU devices: sharded batches, exact resume, two JAX processes.

The 8 devices are XLA's host platform split in 8
(``XLA_FLAGS=--xla_force_host_platform_device_count=8``, set before JAX is imported
here); the two-process test starts two JAX processes of 4 devices each on loopback.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

# 8 CPU devices; XLA aborts a process whose devices' threads meet late at a collective
# (40 s by default), which an oversubscribed 2-core machine can reach: wait instead
os.environ["XLA_FLAGS"] = (
    "--xla_force_host_platform_device_count=8"
    " --xla_cpu_collective_call_terminate_timeout_seconds=600"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np
import pytest
import zarr
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from strategies import interrupted_epoch, interruptions, property_settings

from daskzarr_batches import ArgumentTypeError, ArgumentValueError, Loader, MissingChunksWarning
from daskzarr_batches.jax import JaxLoader, process_share

ROOT = Path(__file__).resolve().parents[2]
ROWS, BATCH = 400, 32


@pytest.fixture(scope="module")
def arrays(tmp_path_factory: pytest.TempPathFactory) -> dict[str, zarr.Array]:
    root = tmp_path_factory.mktemp("jax")
    x = zarr.create_array(root / "x.zarr", shape=(ROWS, 6), chunks=(48, 6), dtype="f4")
    x[:] = np.arange(ROWS * 6, dtype="f4").reshape(ROWS, 6)
    y = zarr.create_array(root / "y.zarr", shape=(ROWS,), chunks=(64,), dtype="i8")
    y[:] = np.arange(ROWS)
    return {"x": x, "y": y}


@pytest.fixture(scope="module")
def batch_sharding() -> NamedSharding:
    assert jax.device_count() == 8, "XLA_FLAGS was set after JAX was imported elsewhere"
    return NamedSharding(Mesh(np.array(jax.devices()), ("batch",)), PartitionSpec("batch"))


def _loader(arrays: dict[str, zarr.Array], **kwargs: Any) -> Loader:
    return Loader(arrays, BATCH, shuffle=True, seed=3, drop_remainder=True, **kwargs)


def test_sharded_batches_equal_the_numpy_loaders(arrays: Any, batch_sharding: Any) -> None:
    expected = list(_loader(arrays))
    got = list(JaxLoader(_loader(arrays), sharding=batch_sharding))
    assert len(got) == len(expected) == ROWS // BATCH
    for mine, theirs in zip(got, expected, strict=True):
        assert set(mine) == {"x", "y"}
        for key in ("x", "y"):
            value = mine[key]
            assert isinstance(value, jax.Array) and value.sharding == batch_sharding
            shards = value.addressable_shards
            assert len({shard.device for shard in shards}) == 8
            assert all(shard.data.shape[0] == BATCH // 8 for shard in shards)
            np.testing.assert_array_equal(np.asarray(value), theirs[key])
            # 64-bit as 32-bit unless jax_enable_x64: JAX's rule, not ours
            assert value.dtype == jax.dtypes.canonicalize_dtype(theirs[key].dtype)


def test_one_device_and_tuples_without_prefetch(arrays: Any) -> None:
    pair = (arrays["x"], arrays["y"])
    jl = JaxLoader(Loader(pair, BATCH), prefetch=0)
    batches = list(jl)
    assert len(batches) == len(jl) == -(-ROWS // BATCH)  # the short last batch too
    x, y = batches[-1]
    assert isinstance(x, jax.Array) and x.devices() == {jax.devices()[0]}
    np.testing.assert_array_equal(np.asarray(y), np.arange(ROWS)[-(ROWS % BATCH) :])
    assert jl.epoch == 1 and jl.state_dict()["epoch"] == 1


def test_mid_epoch_resume_is_exact(arrays: Any, batch_sharding: Any) -> None:
    whole = [np.asarray(b["y"]) for b in JaxLoader(_loader(arrays), sharding=batch_sharding)]
    jl = JaxLoader(_loader(arrays), sharding=batch_sharding, prefetch=3)
    first = []
    for batch in jl:
        first.append(np.asarray(batch["y"]))
        if len(first) == 4:
            break
    state = json.loads(json.dumps(jl.get_state()))  # plain data, as a checkpoint holds it
    assert state["batches"] == 4  # the three prefetched batches are not counted
    again = JaxLoader(_loader(arrays), sharding=batch_sharding)
    again.set_state(state)
    rest = [np.asarray(b["y"]) for b in again]
    np.testing.assert_array_equal(np.concatenate(first + rest), np.concatenate(whole))
    assert again.bottleneck().stage in {"store requests", "decoding", "assembling batches",
                                        "consumer step"}  # fmt: skip


def test_bad_arguments_are_named(arrays: Any, batch_sharding: Any) -> None:
    with pytest.raises(ArgumentTypeError, match="Loader"):
        JaxLoader(arrays["x"])  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="sharding"):
        JaxLoader(_loader(arrays), sharding="batch")
    with pytest.raises(ArgumentValueError, match="prefetch must be >= 0, got -1"):
        JaxLoader(_loader(arrays), prefetch=-1)
    ragged = JaxLoader(Loader(arrays["x"], 12), sharding=batch_sharding)
    with pytest.raises(ArgumentValueError, match=r"shape \(12, 6\).*drop_remainder"):
        next(iter(ragged))
    assert process_share() == {"rank": 0, "world_size": 1}


@property_settings(12)
@given(case=interruptions(), prefetch=st.sampled_from([0, 2]))
def test_every_sample_once_across_interruptions(case: dict[str, Any], prefetch: int) -> None:
    """Breaks, exceptions in the loop body and failing transforms (tests/strategies.py)."""
    interrupted_epoch(
        case, lambda loader: JaxLoader(loader, prefetch=prefetch), lambda b: np.asarray(b).tolist()
    )


def test_a_break_goes_on_with_the_prefetched_batches(batch_sharding: Any) -> None:
    jl = JaxLoader(Loader(np.arange(1000), 40, shuffle=True, seed=1), prefetch=2)
    seen: list[int] = []
    for batch in jl:
        seen += np.asarray(batch).tolist()
        if len(seen) == 200:
            break
    assert jl.state_dict()["batches"] == 5
    seen += [i for batch in jl for i in np.asarray(batch).tolist()]
    assert sorted(seen) == list(range(1000))  # was 920: the 2 put ahead were lost


def test_the_loaders_own_state_in_the_loop_is_the_feeds() -> None:
    """``loader.state_dict()`` taken in the feed's loop counted the prefetched batches."""
    loader = Loader(np.arange(400), 40, shuffle=True, seed=1)
    seen: list[int] = []
    for batch in JaxLoader(loader, prefetch=3):
        seen += np.asarray(batch).tolist()
        if len(seen) == 120:
            state = loader.state_dict()
    assert (state["batches"], state["position"]) == (3, 120)  # was (6, 240)
    again = Loader(np.arange(400), 40, shuffle=True, seed=1)
    again.load_state_dict(state)
    assert seen[:120] + [i for batch in again for i in batch.tolist()] == seen


def test_big_endian_arrays_are_converted(tmp_path: Path, batch_sharding: Any) -> None:
    x = zarr.create_array(tmp_path / "be.zarr", shape=(64, 3), chunks=(16, 3), dtype=">f4",
                          zarr_format=2)  # fmt: skip
    x[:] = np.arange(192, dtype="f4").reshape(64, 3)
    assert x.dtype == np.dtype(">f4")
    got = [np.asarray(b) for b in JaxLoader(Loader(x, 16), sharding=batch_sharding)]
    np.testing.assert_array_equal(np.concatenate(got), x[:])


@pytest.mark.parametrize("dtype", ["M8[s]", "m8[ms]", [("a", "f4"), ("b", "i4")]], ids=str)
def test_a_dtype_jax_cannot_hold_is_refused_before_the_first_batch(dtype: Any) -> None:
    dtype = np.dtype(dtype)
    data = {"t": np.zeros(32, dtype=dtype), "y": np.arange(32)}
    named = rf"array <numpy t .* has dtype {re.escape(str(dtype))}"
    with pytest.raises(ArgumentTypeError, match=named):
        JaxLoader(Loader(data, 8))
    # made by a transform: refused at the first batch, naming the batch array
    as_dates = Loader(np.arange(32), 8, transform=lambda b: {"t": b.astype(dtype)})
    with pytest.raises(ArgumentTypeError, match=r"batch\['t'\].*JAX arrays cannot hold"):
        next(iter(JaxLoader(as_dates)))


def test_int64_beyond_32_bits_is_refused_where_jax_would_wrap_it() -> None:
    assert not jax.config.jax_enable_x64
    y = np.array([0, 1, 2**31 - 1, 2**40, -(2**31), -(2**31) - 1], dtype="i8")
    jl = JaxLoader(Loader({"y": y}, 3), prefetch=2)
    batches = iter(jl)
    assert np.asarray(next(batches)["y"]).tolist() == [0, 1, 2**31 - 1]  # they fit
    with pytest.raises(ArgumentValueError, match=r"batch\['y'\] \(int64\) holds 1099511627776"):
        next(batches)
    assert jl.state_dict()["batches"] == 1  # the refused batch is not counted
    u = JaxLoader(Loader(np.array([2**32], dtype="u8"), 1))
    with pytest.raises(ArgumentValueError, match=r"\(uint64\) holds 4294967296.*uint32"):
        next(iter(u))


def test_a_prefetch_threads_warning_points_at_the_loop(tmp_path: Path) -> None:
    """A MissingChunksWarning raised on the prefetch thread was attributed to threading.py."""
    x = zarr.create_array(tmp_path / "m.zarr", shape=(64, 2), chunks=(16, 2), dtype="f4")
    x[:] = 1.0
    (tmp_path / "m.zarr" / "c" / "2" / "0").unlink()
    jl = JaxLoader(Loader(x, 8, missing="warn"), prefetch=2)
    with pytest.warns(MissingChunksWarning) as caught:
        line = sys._getframe().f_lineno + 1
        for _ in jl:  # the warning's line
            pass
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, line)]


PROCESS = textwrap.dedent(
    """
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    process, port, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process)
    import numpy as np, zarr
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from daskzarr_batches import Loader
    from daskzarr_batches.jax import JaxLoader, process_share
    mesh = Mesh(np.array(jax.devices()), ("batch",))
    sharding = NamedSharding(mesh, PartitionSpec("batch"))
    x = zarr.open_array(path, mode="r")
    host = Loader(x, 16, shuffle=True, seed=5, drop_remainder=True, **process_share())
    local = [b.copy() for b in Loader(x, 16, shuffle=True, seed=5, drop_remainder=True,
                                      **process_share())]
    seen = []
    for batch, mine in zip(JaxLoader(host, sharding=sharding), local, strict=True):
        assert batch.shape == (32, 3), batch.shape
        parts = sorted(batch.addressable_shards, key=lambda s: s.index[0].start)
        assert len(parts) == 4 and {s.device.process_index for s in parts} == {process}
        got = np.concatenate([np.asarray(s.data) for s in parts])
        assert (got == mine).all()
        seen += mine[:, 0].astype(int).tolist()
    print(json.dumps({"process": process, "devices": jax.device_count(), "ids": seen}))
    """
)


def test_two_jax_processes_read_disjoint_shares(tmp_path: Path) -> None:
    x = zarr.create_array(tmp_path / "x.zarr", shape=(256, 3), chunks=(32, 3), dtype="f4")
    x[:] = np.repeat(np.arange(256, dtype="f4")[:, None], 3, axis=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PROCESS, str(i), str(port), str(tmp_path / "x.zarr")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in (0, 1)
    ]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert [o["devices"] for o in outs] == [8, 8]
    first, second = (set(o["ids"]) for o in outs)
    assert len(first) == len(second) == 128 and not first & second
    assert first | second == set(range(256))


def test_the_devices_benchmark_runs_and_writes_its_table(tmp_path: Path) -> None:
    """``python -m benchmarks --only jax``, in this process (JAX is up with 8 devices)."""
    import argparse

    from benchmarks.devices import run

    options = argparse.Namespace(rows=8192, rounds=1, out=tmp_path / "out", data=tmp_path)
    result = run(options)
    table = (tmp_path / "out" / "jax.md").read_text(encoding="utf-8")
    assert "| JaxLoader, 8 devices (sharded) |" in table and "Target: " in table
    assert "hand loop: jax.device_put(b, sharding), 8 devices" in table
    assert result["ratio"]["8,192 x 32 | Loader (numpy)"] == 1.0 and result["median"]
    assert [t["what"].split("]")[0] for t in result["targets"]][:1] == ["[8,192 x 32"]
