"""The exact shuffle's order as a keyed bijection of ``[0, n)``: any position's sample in O(1).

:class:`IndexShuffle` maps epoch positions to sample ids without holding the
permutation (the idea of Grain's ``index_shuffle``): a balanced Feistel
network over ``2 * half`` bits, the smallest even width that covers ``n``
(so at most ``4 n`` values), keyed by ``ROUNDS`` 64-bit round keys drawn from
``SeedSequence(seed, spawn_key=(epoch,))``, and *cycle-walking*: a value that
lands at or past ``n`` is sent through the network again until it falls
inside (a Feistel network is a permutation of its ``2**(2 half)`` values, so
its restriction by walking is a permutation of ``[0, n)``).  The round
function is MurmurHash3's 64-bit finaliser of the half and the round key.

Vectorised in numpy (uint64, wrapping arithmetic): a window of ``W``
positions costs O(W) time and memory, whatever ``n``; :meth:`inverse` gives a
sample's position the same way.  Everything is integer arithmetic on fixed
widths, so a ``(seed, epoch)`` gives one order on every platform, process and
worker.  :data:`ORDER_VERSION` names this order in a loader's state (the order
before it, numpy's ``Generator.permutation``, was version 1).  Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt

__all__ = ["ORDER_VERSION", "ROUNDS", "IndexShuffle"]

#: Feistel rounds; 6 rounds of a murmur-mixed round function pass the quality tests
#: (batch mixing, neighbour entropy, uniformity of a position's sample) with margin.
ROUNDS = 6

#: The exact order's version in a ``Loader`` state: 2 for this bijection
#: (1: numpy's ``Generator.permutation`` of ``(seed, epoch)``, before it).
ORDER_VERSION = 2

#: MurmurHash3's finalisers: (shift, multiplier, shift, multiplier, shift) for 64 and 32 bits
_FMIX64 = (33, 0xFF51AFD7ED558CCD, 33, 0xC4CEB9FE1A85EC53, 33)
_FMIX32 = (16, 0x85EBCA6B, 13, 0xC2B2AE35, 16)

#: values walked at a time: their scratch arrays stay in cache
_BLOCK = 1 << 15

Ids = npt.NDArray[np.int64]
Words = npt.NDArray[np.uint64] | npt.NDArray[np.uint32]


def _fmix(x: Words, scratch: Words, mix: tuple[int, ...]) -> None:
    """A MurmurHash3 finaliser in place on ``x`` (``scratch``: an array like it)."""
    dtype = x.dtype.type
    s1, m1, s2, m2, s3 = (dtype(v) for v in mix)
    np.right_shift(x, s1, out=scratch)
    x ^= scratch
    x *= m1
    np.right_shift(x, s2, out=scratch)
    x ^= scratch
    x *= m2
    np.right_shift(x, s3, out=scratch)
    x ^= scratch


@dataclass(frozen=True)
class IndexShuffle:
    """A keyed permutation of ``range(n)``: ``shuffle(positions)`` -> sample ids.

    Parameters
    ----------
    n : int
        Size of the domain (``n >= 0``).
    keys : tuple of int
        The round keys (``ROUNDS`` 64-bit integers); see :meth:`of`.

    Examples
    --------
    >>> order = IndexShuffle.of(10, seed=0, epoch=0)
    >>> sorted(order(np.arange(10)).tolist()) == list(range(10))
    True
    """

    n: int
    keys: tuple[int, ...]

    @classmethod
    def of(cls, n: int, seed: int, epoch: int) -> IndexShuffle:
        """The order of ``(seed, epoch)``: keys from ``SeedSequence(seed, spawn_key=(epoch,))``."""
        state = np.random.SeedSequence(seed, spawn_key=(epoch,)).generate_state(ROUNDS, np.uint64)
        return cls(int(n), tuple(int(k) for k in state))

    @property
    def half(self) -> int:
        """Bits of each Feistel half: the network permutes ``[0, 4**half)``, ``>= n``."""
        bits = max(int(self.n - 1).bit_length(), 2) if self.n > 1 else 2
        return (bits + 1) // 2

    def __call__(self, positions: npt.ArrayLike) -> Ids:
        """The sample id at each epoch position (``0 <= position < n``), as int64."""
        return self._walk(positions, inverse=False)

    def inverse(self, ids: npt.ArrayLike) -> Ids:
        """The epoch position of each sample id: ``inverse(self(p)) == p``."""
        return self._walk(ids, inverse=True)

    def window(self, lo: int, hi: int) -> Ids:
        """The sample ids at positions ``lo:hi`` (clipped to ``[0, n)``), in O(hi - lo)."""
        lo, hi = max(int(lo), 0), min(int(hi), self.n)
        return self(np.arange(lo, max(lo, hi), dtype=np.int64))

    def _walk(self, values: npt.ArrayLike, inverse: bool) -> Ids:
        x = np.asarray(values, dtype=np.int64)
        if x.size and (int(np.min(x)) < 0 or int(np.max(x)) >= self.n):
            raise ValueError(f"values outside [0, {self.n}): {np.min(x)}..{np.max(x)}")
        flat = x.ravel()
        out = np.empty(flat.size, dtype=np.int64)
        for lo in range(0, flat.size, _BLOCK):
            out[lo : lo + _BLOCK] = self._walk_block(flat[lo : lo + _BLOCK], inverse)
        return out.reshape(x.shape)

    def _walk_block(self, values: Ids, inverse: bool) -> Ids:
        """One block through the network until every value is below ``n`` (cycle-walking)."""
        wide = self.half > 16  # halves of up to 16 bits are walked in 32-bit words
        dtype = np.uint64 if wide else np.uint32
        x = cast(Words, values.astype(dtype))
        self._network(x, inverse)
        n = dtype(self.n)
        todo = np.flatnonzero(x >= n)
        while todo.size:  # expected passes: the network's 4**half / n, at most 4
            part = cast(Words, x[todo])
            self._network(part, inverse)
            x[todo] = part
            todo = todo[part >= n]
        return x.astype(np.int64)

    def _network(self, x: Words, inverse: bool) -> None:
        """One pass of the Feistel network (or its inverse), in place on ``x < 4**half``."""
        dtype = x.dtype.type
        wide = dtype is np.uint64
        mix = _FMIX64 if wide else _FMIX32
        h, mask = dtype(self.half), dtype((1 << self.half) - 1)
        left = x >> h
        right = x & mask
        hashed, scratch = np.empty_like(x), np.empty_like(x)
        keys = self.keys[::-1] if inverse else self.keys
        for key in keys:
            k = dtype(key if wide else key & 0xFFFFFFFF)
            # forward (L, R) -> (R, L ^ F(R)); inverse (L, R) <- (R ^ F(L), L)
            np.add(left if inverse else right, k, out=hashed)
            _fmix(hashed, scratch, mix)
            hashed &= mask
            if inverse:
                hashed ^= right
                left, right, hashed = hashed, left, right
            else:
                hashed ^= left
                left, right, hashed = right, hashed, left
        np.left_shift(left, h, out=x)
        x |= right
