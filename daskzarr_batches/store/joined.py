"""The sources a stream reads a collection through: members joined along axis 0.

:class:`ConcatSource`: the members' axis-0 chunks one after another, so the
plan, ranks and resume see one array (``split`` cuts a window's pieces per
member, ``member_block`` maps a chunk stream's block, ``provenance`` maps
sample ids to ``(member, position)``); :class:`MixSource`, a mixture's
(a ``ConcatSource`` carrying its mixing rule); :class:`SourcesSource`, the
provenance output of ``return_sources=True``, computed from the sample ids,
never read.  Made by ``store.collections`` (which exports them too).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from ..plan.windows import ChunkPiece, RunIndex, chunk_offsets
from .direct import DirectLayout
from .sources import SliceSource, Source

__all__ = ["ConcatSource", "MixRule", "MixSource", "SourcesSource", "sources_source"]


@dataclass(frozen=True)
class ConcatSource(Source):
    """Member sources end to end along axis 0, as one source.

    Its axis-0 chunks are the members' non-empty axis-0 chunks, member after
    member; ``chunk_member[c]`` / ``chunk_local[c]`` say which member and
    which of its chunks global chunk ``c`` is, ``offsets[m]`` where member
    ``m`` starts.  Its other axes' chunks are the first member's (a chunk
    stream hands out each member's own blocks: :meth:`blocks`).
    """

    members: tuple[Source, ...] = field(repr=False, default=())

    @property
    def joins_members(self) -> bool:
        """A collection: its windows are read per member and joined."""
        return True

    def read_collection(self) -> ConcatSource:
        """Itself."""
        return self

    @property
    def member_sources(self) -> tuple[Source, ...]:
        """The members."""
        return self.members

    def member_index(self) -> RunIndex:
        """:attr:`member_of`."""
        return self.member_of

    def block_sizes(self, block: tuple[int, ...]) -> tuple[int, ...]:
        """A member's block: its shape in the member's own grid."""
        return tuple(s.stop - s.start for s in self.block_slices(block))

    def part_chunk(self, chunk: int) -> tuple[int, int]:
        """The member holding axis-0 chunk ``chunk`` and its chunk there."""
        return int(self.chunk_member[chunk]), int(self.chunk_local[chunk])

    def member_offsets(self) -> tuple[int, ...]:
        """Where each member starts (empty for a collection of one)."""
        return tuple(int(v) for v in self.offsets) if len(self.members) > 1 else ()

    def parts(self) -> tuple[Source, ...]:
        """The members."""
        return self.members

    def with_parts(self, parts: tuple[Source, ...]) -> Source:
        """This collection of ``parts`` as its members."""
        return replace(self, members=tuple(parts))

    @functools.cached_property
    def offsets(self) -> np.ndarray:
        """Where each member starts along axis 0, and the total: ``M + 1`` values."""
        return chunk_offsets([member.n_samples for member in self.members])

    @functools.cached_property
    def member_of(self) -> RunIndex:
        """The member of each sample id (``RunIndex`` over :attr:`offsets`)."""
        return RunIndex(self.offsets)

    @functools.cached_property
    def direct_layouts(self) -> tuple[DirectLayout | None, ...]:
        """Per member: its :class:`DirectLayout` when ``store.direct`` decodes its chunks
        straight into rows (a Zarr array of the plain zstd layout), else ``None``."""
        return tuple(
            DirectLayout.of(member.array) if isinstance(member, SliceSource) else None
            for member in self.members
        )

    @functools.cached_property
    def _grid(self) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...]]:
        member_of: list[int] = []
        local: list[int] = []
        to_global: list[np.ndarray] = []
        for m, member in enumerate(self.members):
            sizes = np.asarray(member.chunks[0], dtype=np.int64)
            keep = np.flatnonzero(sizes > 0)
            glob_index = np.full(len(sizes), -1, dtype=np.int64)
            glob_index[keep] = len(local) + np.arange(len(keep))
            to_global.append(glob_index)
            member_of.extend([m] * len(keep))
            local.extend(keep.tolist())
        return np.asarray(member_of, np.int64), np.asarray(local, np.int64), tuple(to_global)

    @property
    def chunk_member(self) -> np.ndarray:
        """The member of each global axis-0 chunk."""
        return self._grid[0]

    @property
    def chunk_local(self) -> np.ndarray:
        """Each global axis-0 chunk's index in its member's grid."""
        return self._grid[1]

    def global_chunk(self, member: int, chunk: int) -> int:
        """Global axis-0 chunk of ``member``'s chunk ``chunk``."""
        return int(self._grid[2][member][chunk])

    def split(self, pieces: Sequence[ChunkPiece]) -> list[tuple[int, list[ChunkPiece]]]:
        """A window's pieces (ascending chunks) per member touched, in members' coordinates."""
        out: list[tuple[int, list[ChunkPiece]]] = []
        member_of, local, offsets = self.chunk_member, self.chunk_local, self.offsets
        for piece in pieces:
            m = int(member_of[piece.chunk])
            shift = int(offsets[m])
            moved = ChunkPiece(
                int(local[piece.chunk]), piece.start - shift, piece.stop - shift,
                piece.take, piece.dest,
            )  # fmt: skip
            if out and out[-1][0] == m:
                out[-1][1].append(moved)
            else:
                out.append((m, [moved]))
        return out

    def blocks(self) -> Iterator[tuple[int, ...]]:
        """Every member's non-empty blocks, axis 0 numbered globally, members in order."""
        for m, member in enumerate(self.members):
            for block in member.blocks():
                yield (self.global_chunk(m, block[0]), *block[1:])

    def member_block(self, block: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        """The member holding ``block`` and the block's index in that member's grid."""
        m = int(self.chunk_member[block[0]])
        return m, (int(self.chunk_local[block[0]]), *block[1:])

    def block_slices(self, block: tuple[int, ...]) -> tuple[slice, ...]:
        m, local = self.member_block(block)
        slices = self.members[m].block_slices(local)
        shift = int(self.offsets[m])
        return (slice(slices[0].start + shift, slices[0].stop + shift), *slices[1:])

    def provenance(self, samples: np.ndarray) -> np.ndarray:
        """``(member, position within it)`` of each sample id, an int64 ``(n, 2)`` array."""
        samples = np.asarray(samples, dtype=np.int64)
        out = np.empty((len(samples), 2), dtype=np.int64)
        member = self.member_of(samples)
        out[:, 0] = member
        out[:, 1] = samples - self.offsets[member]
        return out


@dataclass(frozen=True)
class SourcesSource(Source):
    """The provenance output of a stream over a collection: ``(member, position)`` rows.

    Its axis-0 chunks are ``rows``' (the stream's first source), so the plan
    gives it the same pieces; the read layer computes its rows from the
    pieces' sample ids (``collection.provenance``), mapped first through
    ``rows`` when that is a chunk subset of the collection.
    """

    rows: Source = field(repr=False, default=None)  # type: ignore[assignment]
    collection: ConcatSource = field(repr=False, default=None)  # type: ignore[assignment]

    @property
    def computed(self) -> bool:
        """Computed from the sample ids."""
        return True


def sources_source(rows: Source, collection: ConcatSource) -> SourcesSource:
    """The provenance output of a stream whose first source is ``rows``."""
    return SourcesSource(
        "sources", (rows.n_samples, 2), np.dtype(np.int64), (rows.chunks[0], (2,)),
        rows, collection,
    )  # fmt: skip


class MixRule(NamedTuple):
    """What fixes a mixture's draws (:attr:`MixSource.rule`), compared as a tuple."""

    lengths: tuple[int, ...]
    weights: tuple[float, ...]
    stop: str
    samples_per_epoch: int | None
    seed: int


@dataclass(frozen=True)
class MixSource(ConcatSource):
    """A mixture's sources joined as a collection (:class:`ConcatSource`), with its mixing rule.

    Reading, chunk-awareness and provenance are the collection's; the epoch
    order is the mixture's (``plan.mix.MixOrder``, made by the stream's spec).
    """

    weights: tuple[float, ...] = ()
    stop: str = "first_exhausted"
    samples_per_epoch: int | None = None
    seed: int = 0

    @property
    def rule(self) -> MixRule:
        """What fixes the draws: paired mixtures must agree on it."""
        lengths = tuple(member.n_samples for member in self.members)
        return MixRule(lengths, self.weights, self.stop, self.samples_per_epoch, self.seed)

    @property
    def mix_rule(self) -> MixRule:
        """:attr:`rule`."""
        return self.rule
