"""The outputs of a run: ``results.md``, ``results.json``, ``throughput.png``, printed ratios."""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import zarr

import daskzarr_batches as dzb

from . import cpu
from .cache_cases import cache_section
from .dataset import default_shape
from .measure import MB, MiB, Result, SuiteRun
from .memory import MMAP_ENV
from .stores_cases import is_store_case, stores_section
from .targets import Target

#: memory table: (case key, label template formatted with the memory record)
MEMORY_ROWS = (
    ("one", "buffered (8 chunks, prefetch {prefetch}), dataset 1x"),
    ("four", "buffered (8 chunks, prefetch {prefetch}), dataset 4x"),
    ("exact", "exact, budget {budget_mib:.0f} MiB, prefetch 0"),
    ("exact_mmap", "exact, same, with `{mmap_env}`"),
)

#: chart colour of each case group
COLOURS = {
    "reference": "#888888",
    "naive": "#d62728",
    "peer": "#ff7f0e",
    "this": "#1f77b4",
    "cluster": "#17becf",
}


def command_line(run: SuiteRun) -> str:
    """The command that reproduces the run's dataset."""
    ds = run.dataset
    command = "python -m benchmarks" + (" --quick" if run.quick else "")
    if (ds.rows, ds.cols, ds.chunk_rows) != default_shape(run.quick):
        command += f" --rows {ds.rows} --cols {ds.cols} --chunk-rows {ds.chunk_rows}"
    return command


def header(run: SuiteRun, command: str, now: str) -> list[str]:
    ds = run.dataset
    return [
        "# Benchmark results",
        "",
        f"`{command}` on {now}: {ds.rows:,} x {ds.cols} float32 features "
        f"({ds.feature_bytes / MB:.0f} MB) + int64 labels, {ds.chunk_rows}-row chunks, "
        f"Zarr default codec, local directory store; {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, zarr {zarr.__version__}, "
        f"numpy {np.__version__}, daskzarr_batches {dzb.__version__}.  "
        f"Load average (1 min) {run.load[0][0]:.1f} at the start, {run.load[1][0]:.1f} at "
        "the end (other jobs on the machine compete for its cores).  "
        f"Throughput is the best of {run.repeats} run(s); cases marked * ran a few "
        "batches and are extrapolated.  Batch 256 unless said.  cpu-s/GB: CPU seconds "
        "of this process (all threads, `time.process_time`) per GB delivered, the median "
        "of the rounds, timed around the same region as the wall clock; x floor: that "
        "over the raw-decode floor's (the stored chunks decoded by numcodecs on one "
        "thread, their bytes read beforehand; issue 20); wall s: the rounds' epoch times.",
    ]


def cases_table(run: SuiteRun) -> list[str]:
    """Every case: best MB/s, median cpu-s/GB (and over the floor), the rounds' wall spread."""
    floor = run.floor_cpu_s_gb()
    lines = [
        "| case | MB/s | samples/s | vs L0 | cpu-s/GB | x floor | wall s min / med / max "
        "| read amp. | RSS growth MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    marks = cpu_marks(run.results.values())
    for r in run.results.values():
        star = " *" if r.extrapolated else ""
        lines.append(
            f"| {r.name}{star} | {r.mb_s:,.1f} | {f'{r.samples_s:,.0f}' if r.samples else '-'} | "
            f"{r.mb_s / run.ref.mb_s:.3g}x | {cpu_cell(r)}{marks.get(r.name, '')} | "
            f"{times_floor(r, floor)} | {spread_cell(r)} | {amplification(r)} | "
            f"{r.rss_growth / MiB:.0f} |"
        )
    notes = {r.extra["cpu_of"] for r in run.results.values() if "cpu_of" in r.extra}
    for note in sorted(notes):
        lines.append("")
        lines.append(f"{CPU_MARKS[note]} CPU of {note}.")
    return lines


#: how the table marks the CPU of a case that counts more than this process
CPU_MARKS = {
    "this process + workers": "†",
    "this process + DataLoader workers reaped within the epoch": "‡",
}


def cpu_marks(results: Any) -> dict[str, str]:
    return {r.name: CPU_MARKS.get(r.extra.get("cpu_of", ""), "") for r in results}


def cpu_cell(result: Result) -> str:
    """Median CPU seconds per GB delivered, or - when not measured."""
    value = result.cpu_s_gb
    return f"{value:.2f}" if math.isfinite(value) else "-"


def times_floor(result: Result, floor: float) -> str:
    """The case's cpu-s/GB over the raw-decode floor's (medians), or -."""
    value = result.cpu_s_gb / floor
    return f"{value:.2f}x" if math.isfinite(value) else "-"


def spread_cell(result: Result) -> str:
    """min / median / max wall seconds of the rounds (one value for a single round)."""
    seconds = result.extra.get("seconds") or [result.seconds]
    if len(seconds) == 1:
        return f"{seconds[0]:.3f}"
    low, median, high = result.spread
    return f"{low:.3f} / {median:.3f} / {high:.3f}"


def amplification(result: Result) -> str:
    """The read amplification, or - when it was not measured (NaN: reads in torch workers)."""
    return f"{result.amplification:.2f}" if math.isfinite(result.amplification) else "-"


def targets_table(targets: list[Target]) -> list[str]:
    lines = ["## Targets (issue 3)", "", "| target | measured | result |", "|---|---|---|"]
    for t in targets:
        why = f" ({t.why})" if t.why else ""
        lines.append(f"| {t.what} | {t.measured} | {t.status}{why} |")
    return lines


def prefetch_section(prefetch: dict[str, float]) -> list[str]:
    return [
        "## Prefetch",
        "",
        f"Buffered shuffle, batch 256, consumer sleeping {prefetch['busy'] * 1e6:.0f} us "
        f"a batch (1.2x the per-batch load time, median of the rounds): waited "
        f"{prefetch['wait']:.3f} s of a {prefetch['epoch']:.2f} s epoch "
        f"({100 * prefetch['fraction']:.1f}%).",
    ]


def first_batch_section(first_batch: dict[str, float]) -> list[str]:
    if not first_batch:
        return ["## Time to first batch", "", "Not measured."]
    chunk = first_batch["chunk"]
    lines = [
        "## Time to first batch",
        "",
        "From the stream's constructor call to its first batch (batch 256, prefetch 2), "
        "beside one chunk read (`x[a:b]`, one chunk) in the same rounds; medians.",
        "",
        "| what | ms | in chunk reads |",
        "|---|---:|---:|",
        f"| one chunk read | {chunk * 1e3:.1f} | 1.0 |",
    ]
    if "buffer" in first_batch:
        buffer = first_batch["buffer"]
        lines.append(f"| `x[a:b]` over 8 chunks | {buffer * 1e3:.1f} | {buffer / chunk:.1f} |")
    for name in ("sequential", "buffered"):
        if name in first_batch:
            seconds = first_batch[name]
            label = "buffered shuffle (8 chunks)" if name == "buffered" else name
            lines.append(f"| {label}: first batch | {seconds * 1e3:.1f} | {seconds / chunk:.1f} |")
    return lines


def memory_section(memory: dict[str, Any]) -> list[str]:
    names = {
        "prefetch": memory["prefetch"],
        "budget_mib": memory["budget"] / MiB,
        "mmap_env": " ".join(f"{k}={v}" for k, v in MMAP_ENV.items()),
    }
    lines = [
        "## Memory (fresh process per case, peak RSS)",
        "",
        "| case | peak RSS MiB | baseline MiB | read amp. |",
        "|---|---:|---:|---:|",
    ]
    for key, label in MEMORY_ROWS:
        case = memory[key]
        lines.append(
            f"| {label.format(**names)} | {case['peak'] / MiB:.0f} | "
            f"{case['baseline'] / MiB:.0f} | {case['amplification']:.2f} |"
        )
    lines += [
        "",
        f"Bound for the buffered case: 1.5 x (1 + prefetch) x window "
        f"({memory['window_bytes'] / MiB:.0f} MiB) + 300 MiB = {memory['bound'] / MiB:.0f} MiB.",
    ]
    return lines


def quality_section(quality: list[dict[str, Any]]) -> list[str]:
    lines = [
        "## Shuffle quality (from the plan; nothing read)",
        "",
        "Displacement: mean |new - old position| / n, over 1/3 (a uniform permutation "
        "gives ~1.0, no shuffle 0).  Entropy: bits of the histogram (256 bins) of "
        "differences between neighbouring sample ids (higher is better mixed).",
        "",
        "| mode | displacement | neighbour entropy (bits) | read amp. |",
        "|---|---:|---:|---:|",
    ]
    for row in quality:
        amp = "" if row["amplification"] is None else f"{row['amplification']:.2f}"
        lines.append(
            f"| {row['mode']} | {row['displacement']:.3f} | {row['entropy']:.2f} | {amp} |"
        )
    return lines


def markdown(run: SuiteRun, targets: list[Target], *, command: str, now: str) -> str:
    """``results.md``: the sections, separated by blank lines."""
    sections = [
        header(run, command, now),
        cases_table(run),
        targets_table(targets),
        stores_section(run.results),
        cache_section(run.results),
        cpu.section(run.results),
        prefetch_section(run.prefetch),
        first_batch_section(run.first_batch),
        memory_section(run.memory),
        quality_section(run.quality),
    ]
    if run.skipped:
        reasons = "; ".join(f"{k}: {v}" for k, v in run.skipped.items())
        sections.append([f"Skipped: {reasons}."])
    return "\n\n".join("\n".join(lines) for lines in sections if lines) + "\n"


def payload(run: SuiteRun, targets: list[Target], *, command: str, now: str) -> dict[str, Any]:
    """``results.json``."""
    ref = run.ref
    floor = run.floor_cpu_s_gb()
    return {
        "command": command,
        "date": now,
        "load": run.load,
        "results": [
            asdict(r)
            | {
                "mb_s": r.mb_s,
                "vs_l0": r.mb_s / ref.mb_s,
                "amplification": r.amplification if math.isfinite(r.amplification) else None,
                "cpu": r.cpu if math.isfinite(r.cpu) else None,
                "cpu_s_gb": finite(r.cpu_s_gb),
                "cpu_x_floor": finite(r.cpu_s_gb / floor),
                "wall_min_median_max": list(r.spread),
            }
            for r in run.results.values()
        ],
        "targets": [asdict(t) for t in targets],
        "memory": run.memory,
        "quality": run.quality,
        "prefetch": run.prefetch,
        "first_batch": run.first_batch,
        "skipped": run.skipped,
    }


def finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def write_outputs(run: SuiteRun, targets: list[Target], out: Path) -> None:
    """Write the three files to ``out`` and print the ratios and targets."""
    command = command_line(run)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    (out / "results.md").write_text(markdown(run, targets, command=command, now=now))
    data = payload(run, targets, command=command, now=now)
    (out / "results.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    main = {k: r for k, r in run.results.items() if not is_store_case(k)}  # own table
    chart(out / "throughput.png", main, run.ref)
    print(f"\nwrote {out / 'results.md'}, {out / 'throughput.png'}")
    print_summary(run, targets)


def print_summary(run: SuiteRun, targets: list[Target]) -> None:
    print("\nratios vs L0, cpu-s/GB (median of the rounds):")
    for r in run.results.values():
        print(f"  {r.mb_s / run.ref.mb_s:10.4f}x  {cpu_cell(r):>6}  {r.name}")
    print("\ntargets:")
    for t in targets:
        print(f"  {t.status}  {t.what}: {t.measured}")


def chart(path: Path, results: dict[str, Result], ref: Result) -> None:
    """Horizontal bars of MB/s (log scale), each labelled with its ratio vs L0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = list(results.values())
    fig, ax = plt.subplots(figsize=(9, 0.38 * len(items) + 1.2))
    ys = np.arange(len(items))[::-1]
    ax.barh(ys, [r.mb_s for r in items], color=[COLOURS[r.group] for r in items])
    ax.set_yticks(ys, [r.name + (" *" if r.extrapolated else "") for r in items], fontsize=8)
    ax.set_xscale("log")
    ax.axvline(ref.mb_s, color="black", lw=0.8, ls="--")
    for y, r in zip(ys, items, strict=True):
        label = f"{r.mb_s:,.0f}" if r.mb_s >= 10 else f"{r.mb_s:.2g}"
        ax.text(r.mb_s * 1.05, y, f"{label} ({r.mb_s / ref.mb_s:.2g}x)", va="center", fontsize=7)
    ax.set_xlabel("MB/s (log scale), (ratio vs L0); dashed: L0")
    ax.set_xlim(right=max(r.mb_s for r in items) * 6)
    ax.set_title("daskzarr_batches vs zarr, dask and peers (same run)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
