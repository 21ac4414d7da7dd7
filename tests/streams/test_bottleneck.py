"""``stats.bottleneck()`` names the stage that limits an epoch: a slow store, codec, consumer.

Each case slows one stage for real (a Zarr wrapper store that sleeps in ``get``, a
registered codec that sleeps in its decode, a consumer that sleeps per batch) on a small
array, and checks the stage named and that the numbers behind it add up.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
import zarr.storage
from zarr.abc.codec import BytesBytesCodec
from zarr.registry import register_codec

from daskzarr_batches import Loader

DELAY = 0.02
ROWS, CHUNK, BATCH = 512, 32, 32  # 16 chunks, one batch each


class SleepyStore(zarr.storage.WrapperStore[Any]):
    """A store whose every chunk ``get`` takes ``DELAY`` seconds longer (metadata does not)."""

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        if not key.endswith("zarr.json"):
            await asyncio.sleep(DELAY)
        return await self._store.get(key, prototype, byte_range)


@dataclass(frozen=True)
class SleepyCodec(BytesBytesCodec):  # type: ignore[misc]
    """A codec that passes bytes through, ``DELAY`` seconds per chunk decoded (off the loop)."""

    is_fixed_size = True

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SleepyCodec:
        return cls()

    def to_dict(self) -> dict[str, Any]:
        return {"name": "dzb_test_sleepy"}

    async def _decode_single(self, chunk_bytes: Any, chunk_spec: Any) -> Any:
        await asyncio.to_thread(time.sleep, DELAY)
        return chunk_bytes

    async def _encode_single(self, chunk_bytes: Any, chunk_spec: Any) -> Any:
        return chunk_bytes

    def compute_encoded_size(self, input_byte_length: int, chunk_spec: Any) -> int:
        return input_byte_length


register_codec("dzb_test_sleepy", SleepyCodec)


def _write(path: Path, **kwargs: Any) -> zarr.Array:
    z = zarr.create_array(path, shape=(ROWS, 8), chunks=(CHUNK, 8), dtype="f4", **kwargs)
    z[:] = np.arange(ROWS * 8, dtype="f4").reshape(ROWS, 8)
    return z


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bottleneck") / "plain.zarr"
    _write(path)
    return path


def _epoch(array: Any, step: float = 0.0, **kwargs: Any) -> Any:
    loader = Loader(array, BATCH, window_bytes=4 * CHUNK * 8 * 4, **kwargs)
    for _ in loader:
        if step:
            time.sleep(step)
    return loader.bottleneck()


def test_a_slow_store_is_named(plain: Path) -> None:
    store = SleepyStore(zarr.storage.LocalStore(plain, read_only=True))
    found = _epoch(zarr.open_array(store, mode="r"), io_concurrency=2)
    assert found.stage == "store requests", str(found)
    assert found.store_requests >= ROWS // CHUNK
    assert found.store_busy_seconds >= 0.5 * found.epoch_seconds
    assert "io_concurrency= (now 2" in found.setting
    assert str(found).startswith("bottleneck: store requests")


def test_a_slow_codec_is_named(tmp_path: Path) -> None:
    z = _write(tmp_path / "sleepy.zarr", compressors=[SleepyCodec()])
    found = _epoch(zarr.open_array(z.store, mode="r"))
    assert found.stage == "decoding", str(found)
    assert found.wait_seconds > found.consumer_seconds
    assert found.store_busy_seconds < 0.5 * found.epoch_seconds
    assert "codec_pipeline='zarrs'" in found.setting


def test_a_slow_consumer_is_named(plain: Path) -> None:
    found = _epoch(zarr.open_array(plain, mode="r"), step=DELAY)
    assert found.stage == "consumer step", str(found)
    assert found.consumer_seconds >= (ROWS // BATCH) * DELAY
    assert found.consumer_seconds > 3 * found.wait_seconds
    assert "nothing in the loader" in found.setting


def test_nothing_yet_before_the_first_batch(plain: Path) -> None:
    loader = Loader(zarr.open_array(plain, mode="r"), BATCH)
    assert loader.bottleneck().stage == "nothing yet"


def test_slow_assembly_is_named_without_advising_dataloader_workers() -> None:
    """Cutting batches is the bottleneck: the advice is batch_size or transform, never
    DataLoader workers, which the README measured slower (about 1 ms per batch handed over)."""
    from daskzarr_batches.streams.base import StreamStats
    from daskzarr_batches.streams.timing import bottleneck_of

    stats = StreamStats(items_yielded=10, consumer_seconds=0.01, next_seconds=1.0, wait_seconds=0.1)
    found = bottleneck_of(stats)
    assert found.stage == "assembling batches", str(found)
    assert "batch_size" in found.setting and "not DataLoader workers" in found.setting
