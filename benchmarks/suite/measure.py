"""Timing and peak-RSS measurement, and the record of one suite run."""

from __future__ import annotations

import math
import resource
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import psutil

import daskzarr_batches as dzb

from .dataset import Dataset

MB = 1e6
GB = 1e9
MiB = 2**20
#: the reference every ratio is taken against
L0 = "L0: zarr chunk-aligned, 1 thread"
#: how every raw-decode floor case's name starts (issue 20's CPU yardstick)
FLOOR_PREFIX = "raw-decode floor"

#: what a measured run returns: (bytes, samples, read amplification)
Measured = tuple[int, int, float]


class PeakRSS:
    """Samples this process's RSS in a thread; ``peak`` and ``growth`` in bytes."""

    def __init__(self, interval: float = 0.005) -> None:
        self._process = psutil.Process()
        self._interval = interval
        self._stop = threading.Event()
        self.start = self._process.memory_info().rss
        self.peak = self.start
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            self._stop.wait(self._interval)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)

    @property
    def growth(self) -> int:
        return self.peak - self.start


@dataclass
class Result:
    name: str
    group: str
    seconds: float
    bytes: int
    samples: int
    amplification: float = 1.0
    rss_growth: int = 0
    extrapolated: bool = False
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: CPU seconds of the round kept (this process, all threads; plus reaped children
    #: and a cluster's workers when the case counts them: ``extra["cpu_of"]``)
    cpu: float = math.nan

    @property
    def mb_s(self) -> float:
        return self.bytes / self.seconds / MB if self.seconds > 0 else float("nan")

    @property
    def cpu_s_gb(self) -> float:
        """CPU seconds per GB (10^9 bytes) delivered: the median of the rounds.

        The rounds' CPU seconds (``extra["cpu"]``) when the case ran in
        :func:`rounds`, else this result's own.
        """
        cpu = self.extra.get("cpu")
        seconds = statistics.median(cpu) if isinstance(cpu, list) and cpu else self.cpu
        return seconds / (self.bytes / GB) if self.bytes > 0 else math.nan

    @property
    def spread(self) -> tuple[float, float, float]:
        """Wall seconds of the rounds: (min, median, max); this result's alone if none."""
        seconds = self.extra.get("seconds") or [self.seconds]
        return min(seconds), statistics.median(seconds), max(seconds)

    @property
    def samples_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("nan")


@dataclass
class Case:
    """A measured case: ``run() -> (bytes, samples, amplification)``.

    ``group`` colours the chart (reference, naive, peer, this, cluster);
    ``repeats`` caps the rounds this case takes part in.  ``setup`` runs before
    each timed call, outside the clock (the raw-decode floor reads its chunk files
    there).  ``other_cpu``, if given, is a counter of CPU seconds spent outside this
    process (a cluster's workers), read before and after the timed call; its
    difference is added to the case's CPU and named by ``cpu_of``.
    """

    name: str
    group: str
    run: Callable[[], Measured]
    repeats: int | None = None
    setup: Callable[[], None] | None = None
    other_cpu: Callable[[], float] | None = None
    cpu_of: str = "this process"


def children_cpu() -> float:
    """User + system CPU seconds of this process's children that ended and were reaped."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure_once(case: Case) -> Result:
    """One timed call: wall seconds, CPU seconds and RSS growth around the same region.

    CPU is :func:`time.process_time` (this process, every thread, native ones
    included) plus the CPU of children reaped meanwhile (a torch ``DataLoader``'s
    workers end with its epoch) plus ``case.other_cpu``'s difference.
    """
    if case.setup is not None:
        case.setup()
    other = case.other_cpu() if case.other_cpu is not None else 0.0
    with PeakRSS() as rss:
        children = children_cpu()
        started, cpu = time.perf_counter(), time.process_time()
        nbytes, samples, amplification = case.run()
        seconds = time.perf_counter() - started
        cpu = time.process_time() - cpu + children_cpu() - children
    if case.other_cpu is not None:
        cpu += case.other_cpu() - other
    result = Result(case.name, case.group, seconds, nbytes, samples, amplification, rss.growth)
    result.cpu = cpu
    return result


def rounds(cases: list[Case], repeats: int) -> dict[str, Result]:
    """Run every case once per round, ``repeats`` rounds; keep each case's best.

    Interleaving spreads the load of a shared machine over all cases alike;
    each round starts one case later (round 0 in the given order), so no case
    always runs right after the same one (with a fixed order "sequential,
    batch 256", always right after the raw-decode case, read below batch 32
    in three runs, and ~15% above it alone).

    Every round's wall and CPU seconds are kept in ``extra["seconds"]`` and
    ``extra["cpu"]`` (the spread and the median cpu-s/GB come from them).
    """
    best: dict[str, Result] = {}
    seconds: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for round_number in range(repeats):
        shift = round_number % max(len(cases), 1)
        for case in cases[shift:] + cases[:shift]:
            if round_number >= (case.repeats or repeats):
                continue
            result = measure_once(case)
            seconds.setdefault(case.name, []).append(result.seconds)
            cpu.setdefault(case.name, []).append(result.cpu)
            if case.name not in best or result.seconds < best[case.name].seconds:
                best[case.name] = result
    for case in cases:
        if case.name in best:
            result = best[case.name]
            result.extra |= {"seconds": seconds[case.name], "cpu": cpu[case.name]}
            if case.cpu_of != "this process":
                result.extra["cpu_of"] = case.cpu_of
    for result in best.values():
        print_result(result)
    return best


def print_result(result: Result) -> None:
    low, median, high = result.spread
    print(
        f"  {result.name:56s} {result.mb_s:9.1f} MB/s  {result.cpu_s_gb:5.2f} cpu-s/GB  "
        f"wall {low:.3f}/{median:.3f}/{high:.3f} s  amp {result.amplification:5.2f}  "
        f"RSS +{result.rss_growth / MiB:6.0f} MiB",
        flush=True,
    )


class Drainable(Protocol):
    """A stream of this library: iterable, with ``stats`` once consumed."""

    def __iter__(self) -> Iterator[Any]: ...

    @property
    def stats(self) -> Any: ...


def drain(stream: Drainable) -> Measured:
    """Consume a stream; its bytes, samples and read amplification.

    The epoch is the library's own measurement (:func:`daskzarr_batches.time_epoch`,
    also behind ``daskzarr-batches bench``); the case's time is taken around it.
    """
    _, stats = dzb.time_epoch(lambda: stream)
    return stats.bytes_yielded, stats.samples_yielded, stats.read_amplification


def consume(stream: Any) -> None:
    """Iterate ``stream`` to its end, then close it (the standalone benchmarks' epoch)."""
    with stream:
        for _ in stream:
            pass


def timed(function: Callable[[], Any]) -> tuple[float, float]:
    """Wall seconds and this process's CPU seconds (all threads) of one call."""
    started, cpu = time.perf_counter(), time.process_time()
    function()
    return time.perf_counter() - started, time.process_time() - cpu


class MissingResult(LookupError):
    """A case a target needs was not measured (skipped)."""


@dataclass
class SuiteRun:
    """Everything one run measured, as the targets and the report read it."""

    dataset: Dataset
    quick: bool
    repeats: int
    results: dict[str, Result]
    skipped: dict[str, str]
    prefetch: dict[str, float]
    memory: dict[str, Any]
    quality: list[dict[str, Any]]
    load: tuple[tuple[float, ...], tuple[float, ...]] = ((0.0,), (0.0,))
    #: median seconds to the first batch ("sequential", "buffered") and of one chunk read
    first_batch: dict[str, float] = field(default_factory=dict)

    def first_batch_in_chunk_reads(self, stream: str) -> float:
        """Time to the first batch of ``stream`` over one chunk read of the same run."""
        if stream not in self.first_batch:
            raise MissingResult(f"time to first batch ({stream})")
        return self.first_batch[stream] / self.first_batch["chunk"]

    def result(self, name: str) -> Result:
        try:
            return self.results[name]
        except KeyError:
            raise MissingResult(name) from None

    def named(self, prefix: str) -> str:
        """The name of the measured case that starts with ``prefix``."""
        for name in self.results:
            if name.startswith(prefix):
                return name
        raise MissingResult(prefix)

    @property
    def ref(self) -> Result:
        return self.result(L0)

    def floor_cpu_s_gb(self) -> float:
        """The raw-decode floor's median cpu-s/GB in this run (NaN: not measured)."""
        for name, result in self.results.items():
            if name.startswith(FLOOR_PREFIX):
                return result.cpu_s_gb
        return math.nan

    def ratio(self, name: str, other: str) -> float:
        """Throughput of case ``name`` over that of case ``other``."""
        return self.result(name).mb_s / self.result(other).mb_s

    @property
    def peak_mib(self) -> dict[str, float]:
        """Peak RSS of each memory case, MiB."""
        cases = ("one", "four", "exact", "exact_mmap")
        return {key: self.memory[key]["peak"] / MiB for key in cases}
