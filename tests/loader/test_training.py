"""Issue 9: real training through the loader: a model learns, a crash resumes, DDP steps together.

The data is a synthetic, linearly separable set in a Zarr directory store: ``x``
(N, 16) float32, ``y`` = which side of a fixed random hyperplane, ``ids`` =
``arange(N)`` so every process can report which samples it saw.  The processes
that crash and the two DDP ranks run a helper script (``WORKER``) written to
``tmp_path``, on loopback only.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

import daskzarr_batches as dzb
from daskzarr_batches.torch import ZarrIterableDataset

ROOT = Path(__file__).resolve().parents[2]
N = 20_480  # a multiple of 2 ranks x BATCH: no padding, each sample once per epoch
FEATURES = 16
BATCH = 256
CHUNK = 2_048
BUFFER = 4_096

#: the helper the subprocesses run: ``worker.py MODE ROOT OUT [ARGS...]``
WORKER = r"""
import json, os, sys

import numpy as np
import torch
import zarr

import daskzarr_batches as dzb
from daskzarr_batches.torch import ZarrIterableDataset

torch.set_num_threads(1)
mode, root, out = sys.argv[1:4]
arrays = {n: zarr.open_array(os.path.join(root, n + ".zarr"), mode="r") for n in ("x", "y", "ids")}


def loader(**kw):
    return dzb.Loader(arrays, 256, shuffle=True, shuffle_buffer_size=4096, seed=0, **kw)


def write(name, value):
    with open(os.path.join(out, name), "w") as f:
        json.dump(value, f)


if mode == "crash":  # epoch 1, k batches, save state and ids, die without cleanup
    k = int(sys.argv[4])
    ds = ZarrIterableDataset(loader())
    ds.set_epoch(1)
    ids = []
    for step, batch in enumerate(torch.utils.data.DataLoader(ds, batch_size=None), 1):
        ids += batch["ids"].tolist()
        if step == k:
            write("ids_first.json", ids)
            write("state.json", ds.state_dict())
            os._exit(1)
elif mode == "resume":  # a fresh process: load the state, finish the epoch
    ds = ZarrIterableDataset(loader())
    with open(os.path.join(out, "state.json")) as f:
        ds.load_state_dict(json.load(f))
    ids = []
    for batch in torch.utils.data.DataLoader(ds, batch_size=None):
        ids += batch["ids"].tolist()
    write("ids_rest.json", {"ids": ids, "epoch_after": ds.loader.epoch})
elif mode == "ddp":
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank, port = int(sys.argv[4]), int(sys.argv[5])
    dist.init_process_group(
        "gloo", rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port}"
    )
    torch.manual_seed(rank)  # different initial weights: DDP broadcasts rank 0's
    model = DistributedDataParallel(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ds = ZarrIterableDataset(loader(rank=rank, world_size=2, even_batches=True))
    steps, ids = 0, []
    for batch in torch.utils.data.DataLoader(ds, batch_size=None):
        opt.zero_grad()
        logits = model(batch["x"]).squeeze(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch["y"].float())
        loss.backward()  # the all-reduce of the gradients
        opt.step()
        steps += 1
        ids += batch["ids"].tolist()
    weights = [p.detach().flatten().tolist() for p in model.parameters()]
    write(f"rank{rank}.json", {"steps": steps, "len": len(ds), "ids": ids, "weights": weights})
    dist.destroy_process_group()
"""


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """``x``, ``y``, ``ids`` as Zarr arrays under ``tmp_path / "data"``, chunks of CHUNK rows."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, FEATURES), dtype=np.float32)
    w = rng.standard_normal(FEATURES).astype(np.float32)
    root = tmp_path / "data"
    values = {"x": x, "y": (x @ w > 0).astype(np.int64), "ids": np.arange(N, dtype=np.int64)}
    for name, value in values.items():
        z = zarr.create_array(
            str(root / f"{name}.zarr"),
            shape=value.shape,
            chunks=(CHUNK, *value.shape[1:]),
            dtype=value.dtype,
        )
        z[:] = value
    return root


def open_arrays(root: Path) -> dict[str, zarr.Array]:
    return {n: zarr.open_array(str(root / f"{n}.zarr"), mode="r") for n in ("x", "y", "ids")}


def make_loader(root: Path, **kw: object) -> dzb.Loader:
    return dzb.Loader(
        open_arrays(root), BATCH, shuffle=True, shuffle_buffer_size=BUFFER, seed=0, **kw
    )


def run_worker(tmp_path: Path, *args: object) -> subprocess.Popen[str]:
    """Start the helper script on ``args`` (after mode: the store and the output dir)."""
    script = tmp_path / "worker.py"
    if not script.exists():
        script.write_text(WORKER)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["GLOO_SOCKET_IFNAME"] = "lo"  # gloo's own connections on loopback too
    env["OMP_NUM_THREADS"] = "1"
    mode, *rest = args
    command = [
        sys.executable,
        "-W",
        "error",  # as pytest's filterwarnings: a warning in a worker fails it
        str(script),
        str(mode),
        str(tmp_path / "data"),
        str(tmp_path),
    ]
    return subprocess.Popen(
        command + [str(a) for a in rest],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str]:
    """The process's exit code and stderr; killed (and the test failed) after ``timeout``."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"worker {proc.args[2:]} hung for {timeout} s:\n{err[-2000:]}")
    return proc.returncode, err


def test_a_linear_model_learns_the_zarr_data(store: Path) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(FEATURES, 1)
        opt = torch.optim.Adam(model.parameters(), lr=0.05)
        ds = ZarrIterableDataset(make_loader(store))
        batches = torch.utils.data.DataLoader(ds, batch_size=None)
        seen = []
        for _ in range(3):
            ids = []
            for batch in batches:
                opt.zero_grad()
                logits = model(batch["x"]).squeeze(1)
                loss = torch.nn.functional.binary_cross_entropy_with_logits(
                    logits, batch["y"].float()
                )
                loss.backward()
                opt.step()
                ids.append(batch["ids"].numpy())
            seen.append(np.concatenate(ids))
        arrays = open_arrays(store)
        with torch.no_grad():
            predicted = model(torch.from_numpy(arrays["x"][:])).squeeze(1) > 0
        accuracy = (predicted.numpy() == arrays["y"][:].astype(bool)).mean()
    finally:
        torch.set_num_threads(threads)
    assert ds.loader.epoch == 3
    for ids in seen:  # every epoch: each sample once, in a new order
        np.testing.assert_array_equal(np.sort(ids), np.arange(N))
    assert not np.array_equal(seen[0], seen[1])
    assert accuracy >= 0.97, accuracy  # 0.991 with these seeds


@pytest.mark.timeout(180)
def test_crash_mid_epoch_and_resume_in_a_new_process(store: Path, tmp_path: Path) -> None:
    k = 30  # of 80 batches
    code, err = finish(run_worker(tmp_path, "crash", k), timeout=80)
    assert code == 1, err[-2000:]  # died by os._exit(1), after saving
    first = json.loads((tmp_path / "ids_first.json").read_text())
    assert json.loads((tmp_path / "state.json").read_text())["batches"] == k
    code, err = finish(run_worker(tmp_path, "resume"), timeout=80)
    assert code == 0, err[-2000:]
    rest = json.loads((tmp_path / "ids_rest.json").read_text())
    assert len(first) == k * BATCH and rest["epoch_after"] == 2
    both = np.array(first + rest["ids"])
    np.testing.assert_array_equal(np.sort(both), np.arange(N))  # each sample exactly once
    # ... and in the order of the uninterrupted epoch 1
    uninterrupted = make_loader(store)
    uninterrupted.set_epoch(1)
    np.testing.assert_array_equal(both, np.concatenate([b["ids"] for b in uninterrupted]))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(180)
def test_ddp_two_ranks_step_together_over_disjoint_shares(store: Path, tmp_path: Path) -> None:
    port = free_port()
    procs = [run_worker(tmp_path, "ddp", rank, port) for rank in range(2)]
    try:
        done = [finish(p) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for code, err in done:
        assert code == 0, err[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["steps"] == ranks[1]["steps"] == ranks[0]["len"] == N // (2 * BATCH)
    ids = np.array(ranks[0]["ids"] + ranks[1]["ids"])
    np.testing.assert_array_equal(np.sort(ids), np.arange(N))  # no padding: each exactly once
    assert not set(ranks[0]["ids"]) & set(ranks[1]["ids"])
    # the all-reduce kept the replicas identical (they started from different seeds)
    assert ranks[0]["weights"] == ranks[1]["weights"]
