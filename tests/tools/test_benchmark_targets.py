"""The benchmark's targets table and report, on a fabricated run (nothing measured)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.suite import cache_cases, cases, cpu, report, stores_cases, targets
from benchmarks.suite.dataset import Dataset
from benchmarks.suite.measure import L0, Case, MiB, Result, SuiteRun, rounds


def fabricated(speeds: dict[str, float], skipped: dict[str, str]) -> SuiteRun:
    """A run whose cases moved ``speeds[name]`` MB in one second each."""
    results = {
        name: Result(name, "this", 1.0, int(mb * 1e6), 1000, 4.0 if name == cases.EXACT else 1.0)
        for name, mb in speeds.items()
    }
    memory = {
        "one": {"peak": 200 * MiB, "baseline": 100 * MiB, "amplification": 1.0},
        "four": {"peak": 240 * MiB, "baseline": 100 * MiB, "amplification": 1.0},
        "exact": {"peak": 150 * MiB, "baseline": 100 * MiB, "amplification": 4.0},
        "exact_mmap": {"peak": 170 * MiB, "baseline": 100 * MiB, "amplification": 4.0},
        "bound": 372 * MiB,
        "window_bytes": 16 * MiB,
        "budget": 61 * MiB,
        "prefetch": 2,
    }
    return SuiteRun(
        dataset=Dataset(Path("data.zarr"), 1_000_000, 64, 8192),
        quick=False,
        repeats=5,
        results=results,
        skipped=skipped,
        prefetch={"wait": 0.04, "epoch": 1.0, "fraction": 0.04, "busy": 1e-4, "consumer": 0.9},
        memory=memory,
        quality=[{"mode": "exact", "displacement": 1.0, "entropy": 7.7, "amplification": None}],
    )


SPEEDS = {
    L0: 100.0,
    cases.SEQUENTIAL: 150.0,
    cases.SEQUENTIAL_32: 110.0,
    cases.BUFFERED: 120.0,
    cases.EXACT: 30.0,
    cases.PAIRED_BUFFERED: 90.0,
    cases.DASK_SLICES: 5.0,
    cases.XBATCHER: 2.0,
    cases.LOADER_SEQUENTIAL: 144.0,
    cases.LOADER_BUFFERED: 100.0,
}


def test_targets_pass_miss_and_skip() -> None:
    skipped = {"LocalCluster": "--no-cluster", "torch": "not installed"}
    run = fabricated(SPEEDS, skipped)
    rows = {t.what: (t.measured, t.status, t.why) for t in targets.evaluate(run)}
    assert rows["sequential >= 1.3x L0"] == ("1.50x", "PASS", "")
    assert rows["paired buffered shuffle >= 1.0x L0"] == ("0.90x", "MISS", "")
    assert rows["batch 32 >= 0.8x batch 256 (sequential)"] == ("0.73x", "MISS", "")
    assert rows["exact, windows of 1/4: read amplification <= 4"] == ("4.00", "PASS", "")
    assert rows["exact, windows of 1/4: >= 0.8x L0/4"] == ("1.20x L0/4", "PASS", "")
    assert rows[">= 50x xbatcher BatchGenerator"] == ("75x", "PASS", "")
    assert rows[">= 100x torch DataLoader"] == ("skipped", "SKIP", "not installed")
    assert rows["Loader >= 0.9x batch_stream (sequential)"] == ("0.96x", "PASS", "")
    assert rows["Loader >= 0.9x shuffled_batch_stream (buffered)"] == ("0.83x", "MISS", "")
    torch_loader = "torch DataLoader, 0 workers >= 0.9x Loader (buffered)"
    assert rows[torch_loader] == ("skipped", "SKIP", "not installed")
    assert rows[">= 20x dask: x[slice].compute() per batch"] == ("30x", "PASS", "")
    assert rows["prefetch: wait <= 5% of epoch (consumer 1.2x load)"] == ("4.0%", "PASS", "")
    assert rows["buffered peak RSS <= 1.5 x windows + 300 MB"][1] == "PASS"
    # 40 MiB more at 4x: over both 10% of 200 MiB and 32 MiB
    assert rows["buffered peak RSS flat at 4x dataset"] == ("240 vs 200 MiB", "MISS", "")
    assert rows["exact: RSS over baseline <= budget"] == ("50 MiB vs budget 61 MiB", "PASS", "")
    assert rows["exact: RSS over baseline <= budget (fixed mmap threshold)"][1] == "MISS"
    # no cluster: one SKIP row for both cluster targets; no raw-decode case: no row
    assert rows["LocalCluster >= 0.6x local"] == ("skipped", "SKIP", "--no-cluster")
    assert not any(name.startswith("LocalCluster >= 0.6x local (") for name in rows)
    assert "sequential >= 0.5x raw-decode limit" not in rows


def test_cluster_and_raw_decode_targets_when_measured() -> None:
    speeds = SPEEDS | {
        f"{cases.RAW_DECODE}, 2 threads (limit)": 400.0,
        cases.CLUSTER_SEQUENTIAL: 60.0,
        cases.CLUSTER_BUFFERED: 90.0,
        cases.CLUSTER_TRANSFER: 120.0,
        cases.TORCH_LOADER_0: 95.0,
    }
    rows = {t.what: (t.measured, t.status) for t in targets.evaluate(fabricated(speeds, {}))}
    assert rows["sequential >= 0.5x raw-decode limit"] == ("0.38x", "MISS")
    assert rows["LocalCluster >= 0.6x local (sequential)"] == ("0.40x", "MISS")
    assert rows["LocalCluster >= 0.6x local (buffered)"] == ("0.75x", "PASS")
    assert rows["LocalCluster buffered >= 0.85x transfer-only ceiling"] == ("0.75x", "MISS")
    assert "LocalCluster >= 0.6x local" not in rows
    assert rows["torch DataLoader, 0 workers >= 0.9x Loader (buffered)"] == ("0.95x", "PASS")


def test_store_targets_against_x_all_on_the_same_store() -> None:
    sc = stores_cases
    speeds = SPEEDS | {
        sc.name(sc.UNSHARDED, sc.SEQUENTIAL): 100.0,
        sc.name(sc.SHARDED, sc.SEQUENTIAL): 95.0,
        sc.PIPELINE_LIMIT: 400.0,
        sc.name(sc.ZARRS_PIPELINE, sc.SEQUENTIAL): 260.0,
    }
    for delay in sc.LATENCIES:  # unsharded: chunk_stream 0.4x x[:], the rest 0.96x
        for kind in sc.KINDS:
            fast = {sc.ZARR_ALL: 50.0, sc.CHUNKS: 20.0}.get(kind, 48.0)
            speeds[sc.name(sc.latency_label(False, delay), kind)] = fast
    for kind in sc.KINDS:  # sharded, 20 ms: every kind 0.8x x[:]
        speeds[sc.name(sc.latency_label(True, 0.02), kind)] = 50.0 if kind == sc.ZARR_ALL else 40.0
    run = fabricated(speeds, {"S3": "not installed"})
    rows = {t.what: (t.measured, t.status, t.why) for t in targets.evaluate(run)}
    assert rows["sharded sequential >= 1.0x unsharded (no latency)"] == ("0.95x", "MISS", "")
    assert rows["sharded, 20 ms: chunk_stream >= 0.9x x[:]"] == ("0.80x", "MISS", "")
    assert rows[f"sharded, 20 ms: {sc.EXACT} >= 0.9x x[:]"] == ("0.80x", "MISS", "")
    assert rows[f"20 ms: {sc.SEQUENTIAL} >= 0.9x x[:]"] == ("0.96x", "PASS", "")
    assert rows[f"100 ms: {sc.BUFFERED} >= 0.9x x[:]"] == ("0.96x", "PASS", "")
    assert rows["100 ms: chunk_stream >= 0.9x x[:]"] == ("0.40x", "MISS", "")
    assert rows["S3 loopback >= 0.9x x[:]"] == ("skipped", "SKIP", "not installed")
    assert rows["zarrs pipeline: sequential >= 0.6x raw-decode limit"] == ("0.65x", "PASS", "")
    text = report.markdown(run, targets.evaluate(run), command="", now="now")
    row = f"| {sc.latency_label(False, 0.1)} | 50.0 | 0.96x | 0.96x | 0.96x | 0.96x | 0.40x |"
    assert "\n\n## Stores: sharded" in text and row in text
    assert "\nRaw decode limit 400.0 MB/s (" in text
    assert "): sequential with zarr's pipeline 0.25x, sequential with zarrs 0.65x." in text
    # targets only for the kinds the issue names: no paired / exact rows at 100 ms
    assert f"100 ms: {sc.PAIRED} >= 0.9x x[:]" not in rows
    # --no-stores: one SKIP row for the sharded and latency targets, one for S3 on each
    # backend, one for zarrs
    skipped = dict.fromkeys(sc.SKIP_KEYS, "--no-stores")
    rows = {t.what: (t.measured, t.why) for t in targets.evaluate(fabricated(SPEEDS, skipped))}
    assert rows[targets.STORES] == ("skipped", "--no-stores")
    assert rows["S3 loopback >= 0.9x x[:]"] == ("skipped", "--no-stores")
    measured = [name for name in rows if name.startswith(("sharded", "20 ms", "100 ms", "S3 lo"))]
    assert measured == [targets.STORES, "S3 loopback >= 0.9x x[:]", "S3 loopback via obstore"]
    assert rows[targets.CACHE] == ("skipped", "")  # the chunk cache's cases were not run


def test_cache_targets() -> None:
    cc = cache_cases
    speeds = dict(SPEEDS)
    speeds[cc.name(cc.LOCAL, cc.UNCACHED)] = 400.0
    for delay in stores_cases.LATENCIES:
        label = cc.store_label(delay)
        speeds |= {cc.name(label, cc.UNCACHED): 200.0, cc.name(label, cc.EPOCH_1): 200.0,
                   cc.name(label, cc.EPOCH_2): 1200.0, cc.name(label, cc.DISK): 500.0}  # fmt: skip
    run = fabricated(speeds, {"S3": "not installed"})
    key = cc.name(cc.store_label(stores_cases.LATENCIES[0]), cc.EXACT_READS)
    run.results[key] = Result(key, "this", 1.0, 1, 1, extra={"reads_per_chunk": [1.0, 0.0]})
    rows = {t.what: (t.measured, t.status) for t in targets.evaluate(run)}
    assert rows["20 ms: cache epoch 2 >= 5x epoch 1"] == ("6.00x", "PASS")
    assert rows["100 ms: cache epoch 2 >= 0.8x local store uncached"] == ("3.00x", "PASS")
    assert rows["20 ms: disk cache, new process >= 3x uncached"] == ("2.50x", "MISS")
    assert rows["exact 1/4 budget + cache: store reads in epoch 1 <= 1.0x the chunks"] == (
        "1.00x",
        "PASS",
    )
    assert rows["exact 1/4 budget + cache: store reads in epoch 2 <= 0"] == ("0.00x", "PASS")
    assert rows[targets.CACHE] == ("skipped", "SKIP")  # S3 not installed: its rows


def test_report_has_every_target_row_and_section() -> None:
    run = fabricated(SPEEDS, {"torch": "not installed"})
    evaluated = targets.evaluate(run)
    text = report.markdown(run, evaluated, command="python -m benchmarks", now="now")
    assert "| sequential >= 1.3x L0 | 1.50x | PASS |" in text
    assert "| >= 100x torch DataLoader | skipped | SKIP (not installed) |" in text
    # no CPU measured (NaN): -; one round: its wall seconds alone
    assert f"| {L0} | 100.0 | 1,000 | 1x | - | - | 1.000 | 1.00 | 0 |" in text
    # the read amplification of reads in torch workers is not known: NaN, shown as -
    run.results[cases.TORCH_LOADER_2] = Result(cases.TORCH_LOADER_2, "this", 1.0, 50_000_000,
                                               1000, float("nan"))  # fmt: skip
    text = report.markdown(run, evaluated, command="python -m benchmarks", now="now")
    assert f"| {cases.TORCH_LOADER_2} | 50.0 | 1,000 | 0.5x | - | - | 1.000 | - | 0 |" in text
    payload = report.payload(run, evaluated, command="", now="")
    assert payload["results"][-1]["amplification"] is None
    for section in ("## Targets (issue 3)", "## Prefetch", "## Memory", "## Shuffle quality"):
        assert f"\n\n{section}" in text
    assert "## Stores" not in text  # no store case measured: no section
    assert text.endswith("Skipped: torch: not installed.\n")
    assert report.command_line(run) == "python -m benchmarks"


def test_fast_start_targets_and_section() -> None:
    run = fabricated(SPEEDS, {})
    rows = {t.what: (t.measured, t.status) for t in targets.evaluate(run)}
    # not measured: one SKIP row per group
    assert rows["time to first batch <= 3x one chunk read (sequential)"][1] == "SKIP"
    assert rows["400k rows: sequential >= 1.3x L0"][1] == "SKIP"
    speeds = SPEEDS | {cases.START_L0: 100.0, cases.START_SEQUENTIAL: 140.0,
                       cases.START_PAIRED_BUFFERED: 95.0}  # fmt: skip
    run = fabricated(speeds, {})
    run.first_batch = {"chunk": 0.004, "buffer": 0.025, "sequential": 0.010, "buffered": 0.031}
    evaluated = targets.evaluate(run)
    rows = {t.what: (t.measured, t.status) for t in evaluated}
    assert rows["time to first batch <= 3x one chunk read (sequential)"] == ("2.5x", "PASS")
    buffered = "time to first batch <= 1.2x x[a:b] over its buffer's 8 chunks (buffered)"
    assert rows[buffered] == ("1.24x", "MISS")
    assert rows["400k rows: sequential >= 1.3x L0"] == ("1.40x", "PASS")
    assert rows["400k rows: paired buffered shuffle >= 1.0x L0"] == ("0.95x", "MISS")
    text = report.markdown(run, evaluated, command="", now="")
    assert "| sequential: first batch | 10.0 | 2.5 |" in text
    assert report.payload(run, evaluated, command="", now="")["first_batch"]["chunk"] == 0.004


def test_exact_sweep_targets_pass_miss_or_are_left_out() -> None:
    run = fabricated(SPEEDS, {})
    names = [t.what for t in targets.evaluate(run)]
    assert not any(name.startswith("exact sweep") for name in names)  # not measured
    sweep = {
        str(mib): {"peak": (100 + mib + over) * MiB, "baseline": 100 * MiB, "budget": mib * MiB}
        for mib, over in ((4, 14), (16, 17), (64, 6), (1024, 80))
    }
    run.memory["exact_sweep"] = {"shape": (262_144, 64, 8192), "cases": sweep}
    rows = {t.what: (t.measured, t.status) for t in targets.evaluate(run)}
    limit = "RSS over baseline <= budget + 16 MiB"
    assert rows[f"exact sweep, budget 4 MiB: {limit}"] == ("18 MiB vs 20 MiB", "PASS")
    assert rows[f"exact sweep, budget 16 MiB: {limit}"] == ("33 MiB vs 32 MiB", "MISS")
    assert rows[f"exact sweep, budget 64 MiB: {limit}"] == ("70 MiB vs 80 MiB", "PASS")
    assert rows[f"exact sweep, budget 1 GiB: {limit}"] == ("1104 MiB vs 1040 MiB", "MISS")


def test_patch_targets_against_l0_and_xbatcher_use_medians() -> None:
    from benchmarks.suite import patch_cases as pc

    results = {}
    for chunks in pc.CHUNKINGS:
        # (median seconds, best seconds, samples); stored bytes 100 MB each, xbatcher's 1 MB
        for kind, median, samples in (
            (pc.L0_KIND, 1.0, 0),
            (pc.SEQUENTIAL, 0.5, 10_000),
            (pc.BUFFERED, 2.0, 10_000),
            (pc.PAIRS, 1.0, 63),
            (pc.XBATCHER, 1.0, 100),
        ):
            case = pc.name(chunks, kind)
            stored = 1_000_000 if kind == pc.XBATCHER else 100_000_000
            results[case] = Result(case, "this", 0.1, stored, samples, 1.0)
            results[case].extra |= {"median_seconds": median, "plan_amplification": 1.2}
    run = fabricated({}, {"xbatcher": "not installed"})
    run.results |= results
    rows = {t.what: (t.measured, t.status) for t in targets.evaluate(run, targets.PATCH_TARGETS)}
    label = pc.chunk_label(pc.CHUNKINGS[1])
    assert rows[f"{label}: {pc.SEQUENTIAL} >= 1.0x L0"] == ("2.00x", "PASS")  # medians, not best
    assert rows[f"{label}: {pc.BUFFERED} >= 1.0x L0"] == ("0.50x", "MISS")
    assert rows[f"{label}: {pc.EXACT} >= 1.0x L0"][1] == "SKIP"  # not measured
    assert rows[f"{label}: patches, sequential >= 50x xbatcher (per patch)"] == ("200x", "PASS")
    epoch = f"{label}: forecast pairs, read amplification <= 1.05 (epoch stats)"
    assert rows[epoch] == ("1.00", "PASS")
    assert rows[epoch.replace("epoch stats", "summary")] == ("1.20", "MISS")


def with_rounds(name: str, seconds: list[float], cpu_seconds: list[float]) -> Result:
    """A case of 1 GB whose rounds took ``seconds`` and ``cpu_seconds``."""
    result = Result(name, "this", min(seconds), 10**9, 1000, cpu=cpu_seconds[0])
    result.extra |= {"seconds": seconds, "cpu": cpu_seconds}
    return result


def test_cpu_targets_are_on_the_medians_over_the_floor_and_the_spread() -> None:
    """Issue 20: cpu-s/GB over the raw-decode floor, slowest over fastest epoch, pinned."""
    run = fabricated(SPEEDS, {})
    rows = {t.what: (t.measured, t.status) for t in targets.evaluate(run)}
    assert rows[targets.CPU] == ("skipped", "SKIP")  # not measured: one row each
    assert rows[targets.CPU_ZARRS] == ("skipped", "SKIP")
    steady, jumpy = [0.20, 0.22, 0.25], [0.20, 0.21, 0.30]
    for result in (
        with_rounds(cpu.FLOOR, [0.1, 0.1, 0.1], [1.0, 0.8, 1.2]),  # median 1.0 cpu-s/GB
        with_rounds(cpu.name("zarrs", cpu.SEQUENTIAL), steady, [1.5, 9.0, 1.0]),
        with_rounds(cpu.name("zarr", cpu.SEQUENTIAL), jumpy, [2.2, 2.2, 2.2]),
        with_rounds(cpu.name("zarrs", cpu.BUFFERED), steady, [1.9, 1.9, 1.9]),
        with_rounds(cpu.name("zarr", cpu.BUFFERED), steady, [2.5, 2.5, 2.5]),
        with_rounds(cpu.PINNED_L0, [0.30, 0.30, 0.40], [0.3, 0.3, 0.3]),
        with_rounds(cpu.PINNED_SEQUENTIAL, [0.20, 0.25, 0.50], [0.3, 0.3, 0.3]),
    ):
        run.results[result.name] = result
    evaluated = targets.evaluate(run)
    rows = {t.what: (t.measured, t.status) for t in evaluated}
    floor = "cpu-s/GB <= {}x raw-decode floor (medians)"
    assert rows[f"sequential (zarrs): {floor.format(1.6)}"] == ("1.50x", "PASS")
    assert rows[f"sequential (zarr's pipeline): {floor.format(2.0)}"] == ("2.20x", "MISS")
    buffered = "buffered shuffle (8 chunks)"
    assert rows[f"{buffered} (zarrs): {floor.format(2.0)}"] == ("1.90x", "PASS")
    assert rows[f"{buffered} (zarr's pipeline): {floor.format(2.4)}"] == ("2.50x", "MISS")
    spread = "slowest epoch <= 1.3x the fastest (rounds)"
    assert rows[f"sequential (zarrs): {spread}"] == ("1.25x", "PASS")
    assert rows[f"sequential (zarr's pipeline): {spread}"] == ("1.50x", "MISS")
    pinned = "pinned to one core: sequential (zarr's pipeline) >= 1.0x L0 (medians)"
    assert rows[pinned] == ("1.20x", "PASS")  # medians 0.30 / 0.25, not the best rounds
    text = report.markdown(run, evaluated, command="", now="")
    assert "\n\n## CPU per GB (issue 20)\n" in text
    row = f"| {cpu.name('zarr', cpu.SEQUENTIAL)} | 4,762 | 2.20 | 2.20x | 0.200 / 0.210 / 0.300 |"
    assert row + " 1.50x |" in text
    assert "the sequential stream (zarr's pipeline) at 1.20x L0 (medians)" in text


def test_the_cases_table_has_cpu_per_gb_over_the_floor_and_the_spread() -> None:
    run = fabricated(SPEEDS, {})
    floor = with_rounds(cases.FLOOR, [0.5, 0.6], [1.0, 1.4])  # 1.2 cpu-s/GB
    run.results[floor.name] = floor
    run.results[L0] = with_rounds(L0, [1.0, 2.0, 3.0], [2.0, 2.4, 9.0])
    run.results[L0].extra["cpu_of"] = cases.CLUSTER_CPU
    text = report.markdown(run, targets.evaluate(run), command="", now="")
    assert f"| {L0} | 1,000.0 | 1,000 | 1x | 2.40† | 2.00x | 1.000 / 2.000 / 3.000 |" in text
    assert f"\n\n† CPU of {cases.CLUSTER_CPU}." in text
    data = report.payload(run, targets.evaluate(run), command="", now="")["results"]
    first = next(r for r in data if r["name"] == L0)
    assert (first["cpu_s_gb"], first["cpu_x_floor"]) == (2.4, 2.0)
    assert first["wall_min_median_max"] == [1.0, 2.0, 3.0]


def test_rounds_keep_every_rounds_wall_and_cpu_seconds() -> None:
    counter = iter([0.0, 2.0, 2.0, 4.0])  # "workers" spend 2 CPU seconds a round

    def busy() -> tuple[int, int, float]:
        sum(range(20_000))
        return 10**9, 10, 1.0

    done = rounds([Case("busy", "this", busy, other_cpu=lambda: next(counter), cpu_of="w")], 2)
    result = done["busy"]
    assert len(result.extra["seconds"]) == len(result.extra["cpu"]) == 2
    assert all(2.0 <= c < 3.0 for c in result.extra["cpu"]) and result.extra["cpu_of"] == "w"
    assert 2.0 <= result.cpu_s_gb < 3.0  # 1 GB a round
    low, median, high = result.spread
    assert low == result.seconds <= median <= high


def test_the_cpu_profile_sorts_functions_into_kinds_and_reports_shares() -> None:
    """Issue 20's breakdown on a fabricated yappi record (nothing measured)."""
    from benchmarks import profile_cpu as pc

    functions = {
        "zarr/core/buffer/cpu.py:as_numpy_array_wrapper": 0.8,
        "zarr/core/buffer/cpu.py:NDBuffer.__setitem__": 0.3,
        "numpy:asarray": 0.2,
        "builtins:<method 'take' of 'numpy.ndarray' objects>": 0.2,
        "dask/local.py:get_async": 0.1,
        "asyncio/base_events.py:_UnixSelectorEventLoop._run_once": 0.1,
        "daskzarr_batches/streams/batch.py:BatchStream._produce": 0.1,
        "builtins:len": 0.1,
    }
    kinds = [pc.kind_of(function) for function in functions]
    assert [kind.split(":")[0].split(" (")[0] for kind in kinds] == [
        "decode", "copy in zarr", "sample ids", "copies in this library", "dask",
        "zarr's pipeline and asyncio's event loop", "this library's Python per batch and window",
        "other",
    ]  # fmt: skip
    record = {"plain": 1.5, "profiled": 2.0, "in_threads": 2.0, "bytes": 10**9,
              "functions": functions}  # fmt: skip
    assert pc.shares(record)[pc.RUST] == pytest.approx(0.1)  # 2.0 - 1.9 in functions
    text = pc.report({"sequential, zarr": record}, top=2)
    assert "| cpu-s/GB, unprofiled epochs | 1.50 |" in text
    assert f"| {pc.KINDS[0][0]} | 40.0% (0.80) |" in text
    assert "- 40.0%  0.800 cpu-s/GB  `zarr/core/buffer/cpu.py:as_numpy_array_wrapper`" in text


def test_the_cpu_profiles_single_operations_run_at_a_tiny_size() -> None:
    from benchmarks import profile_cpu as pc

    costs = pc.direct_costs(rows=2048, cols=4, chunk_rows=256, repeats=1)
    assert len(costs) == 6 and all(value >= 0 for value in costs.values())
