"""Plain zstd chunks decoded straight into window rows (``store.direct``), not by Zarr."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr

import daskzarr_batches as dzb
from daskzarr_batches.store.direct import DirectDecoder, direct_reader, frame_size


@pytest.mark.parametrize("n", [0, 1, 255, 256, 257, 65_791, 65_792, 70_000, 2**20 + 3])
@pytest.mark.parametrize("checksum", [False, True])
def test_frame_size_reads_the_content_size_of_every_header_width(n: int, checksum: bool) -> None:
    frame = numcodecs.Zstd(checksum=checksum).encode(np.zeros(n, dtype="u1"))
    assert frame_size(frame) == n
    assert frame_size(b"not zstd at all") is None


def write(path: Path, rows: int = 45, chunk: int = 10, **kw: object) -> zarr.Array:
    array = zarr.create_array(path, shape=(rows, 3), chunks=(chunk, 3), dtype="f4", **kw)
    array[:] = np.arange(rows * 3, dtype="f4").reshape(rows, 3)
    return array


def test_only_the_plain_layout_is_read_directly(tmp_path: Path) -> None:
    assert direct_reader(write(tmp_path / "plain.zarr")) is not None
    assert direct_reader(write(tmp_path / "gzip.zarr", compressors=zarr.codecs.GzipCodec())) is None
    assert direct_reader(write(tmp_path / "sharded.zarr", shards=(20, 3))) is None
    two_d = zarr.create_array(tmp_path / "2d.zarr", shape=(4, 4), chunks=(2, 2), dtype="f4")
    assert direct_reader(two_d) is None
    assert direct_reader(np.zeros((4, 3))) is None


@pytest.mark.parametrize("shuffle", [False, True])
def test_windows_read_directly_equal_zarr_edge_chunk_included(
    tmp_path: Path, shuffle: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = write(tmp_path / "x.zarr")
    reads = []
    read = DirectDecoder.read

    def counted(self: DirectDecoder, spans: Any, *args: Any) -> Any:
        reads.append(len(spans))
        return read(self, spans, *args)

    monkeypatch.setattr(DirectDecoder, "read", counted)
    stream = (
        dzb.shuffled_batch_stream(x, 4, seed=3, shuffle_buffer_size=20)
        if shuffle
        else dzb.batch_stream(x, 4, window_bytes=20 * 12)
    )
    got = np.concatenate(list(stream))
    if shuffle:
        got = got[np.argsort(got[:, 0])]
    np.testing.assert_array_equal(got, x[:])
    assert sum(reads) == 5  # every chunk, the edge one too, read directly


def test_a_frame_of_another_size_is_left_to_zarr_never_read_as_rows(tmp_path: Path) -> None:
    x = write(tmp_path / "x.zarr")
    wrong = numcodecs.Zstd().encode(np.ones(10 * 3 * 4 * 2, dtype="u1"))  # twice the chunk
    (tmp_path / "x.zarr" / "c" / "1" / "0").write_bytes(wrong)
    with pytest.raises(dzb.CorruptChunkError, match=r"samples 10:20, key 'c/1/0'"):
        list(dzb.batch_stream(x, 4))
