"""The run's own train loader alone at several worker counts, and whether the measured training step would wait.

`tools/benchmark.py --loader` uses it: the step's img/s comes from runner.bench.step, the loader's from here. The
loader is built by `build_data` exactly as training builds it, with only DATA.NUM_WORKERS changed per row, and
iterated with no model. Nothing is written.
"""
from __future__ import annotations

import gc
import math
import time
from collections.abc import Iterator
from typing import Any

import torch

from runner.bench.step import sync
from runner.data.sources import source


def in_process(cfg: Any) -> bool:
    """True when DATA.NAME's source makes tensors in the training process: no DataLoader, so no workers."""
    return source(cfg.DATA.NAME).in_process


def rank_cores() -> tuple[int, int]:
    """(CPUs this rank has, the workers DATA.NUM_WORKERS -1 takes): the share training's loader uses."""
    from runner.data.workerstart import cpu_share  # the one place the share is computed; not repeated here

    return cpu_share()


def default_counts(cores: int) -> list[int]:
    """0, 1, 2, 4, ... up to the cores this rank has (the last one always included)."""
    counts, w = [0, 1], 2
    while w < cores:
        counts.append(w)
        w *= 2
    return sorted(set(counts + [cores]))


def configured_workers(cfg: Any, dist) -> int:
    """The workers training's train loader takes for this config (-1 resolved); 0 for in-memory data."""
    from runner.data.loaders import default_workers

    return 0 if in_process(cfg) else default_workers(cfg, dist)


def with_workers(cfg: Any, workers: int) -> Any:
    """A frozen copy of the config with DATA.NUM_WORKERS replaced, validated again."""
    from runner.config import validate

    c = cfg.clone()
    c.defrost()
    c.DATA.NUM_WORKERS = workers
    validate(c)
    c.freeze()
    return c


def _epochs(loader) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches epoch after epoch, so a small training split still gives as many batches as asked."""
    epoch = 0
    while True:
        loader.set_epoch(epoch, 0)
        yield from loader
        epoch += 1


def time_loader(loader, device: torch.device, batches: int, warmup: int) -> dict[str, float]:
    """Draw `warmup` untimed batches, then time `batches` (images counted); the device synced at both ends."""
    it = _epochs(loader)
    try:
        for _ in range(warmup):
            next(it)
        sync(device)
        t0 = time.perf_counter()
        images = sum(len(next(it)[1]) for _ in range(batches))
        sync(device)
        return {"images": images, "seconds": time.perf_counter() - t0}
    finally:
        it.close()


def measure_workers(cfg: Any, dist, workers: int, batches: int, warmup: int) -> dict[str, Any]:
    """One row: the train loader at `workers` workers (built afresh, then released), img/s and img/s per worker."""
    from runner.data import build_data

    bundle = build_data(with_workers(cfg, workers), dist)
    try:
        # the workers start together: their first round of batches comes in a burst, so it is not timed
        t = time_loader(bundle.train, dist.device, batches, warmup + workers)
    finally:
        del bundle
        gc.collect()  # persistent workers end when their DataLoader is collected: before the next row starts
    ips = t["images"] / max(t["seconds"], 1e-9)
    # 0 workers: the training process itself loads, so it counts as one
    return {"workers": workers, "images": t["images"], "seconds": t["seconds"], "img_per_s": ips,
            "img_per_s_per_worker": ips / max(workers, 1)}


def measure(cfg: Any, dist, counts: list[int], batches: int, warmup: int) -> list[dict[str, Any]]:
    """Rows for each worker count (one row, workers 0, for in-memory data, which has no workers)."""
    if in_process(cfg):
        counts = [0]
    return [measure_workers(cfg, dist, w, batches, warmup) for w in counts]


def per_worker_rate(rows: list[dict[str, Any]], cores: int) -> dict[str, Any]:
    """The row whose per-worker rate the verdict scales up: the most workers that fit in the rank's cores."""
    # the most workers, not one: their contention for cores is included, so the estimate is not the best case
    fits = [r for r in rows if 1 <= r["workers"] <= cores]
    if fits:
        return max(fits, key=lambda r: r["workers"])
    over = [r for r in rows if r["workers"] > cores]
    return min(over, key=lambda r: r["workers"]) if over else rows[0]


def verdict(cfg: Any, dist, rows: list[dict[str, Any]], record: dict[str, Any]) -> dict[str, Any]:
    """The figures of the verdict: what the step needs per rank, workers needed, data-bound at the config's count."""
    cores, auto = rank_cores()
    # the step's own rate with the data wait taken out: what it would consume if the loader never held it up
    need = record["train_img_per_s"] / record["world_size"] / max(1.0 - record["data_wait_frac"], 1e-9)
    configured = configured_workers(cfg, dist)
    base = per_worker_rate(rows, cores)
    rate = base["img_per_s_per_worker"]
    at_config = next((r for r in rows if r["workers"] == configured), None)
    gives = at_config["img_per_s"] if at_config else rate * max(configured, 1)
    return {
        "loader": rows, "loader_cores": cores, "loader_auto_workers": auto,
        "loader_need_img_per_s": need,
        "loader_per_worker_img_per_s": rate, "loader_per_worker_from": base["workers"],
        "loader_workers_needed": 0 if in_process(cfg) else math.ceil(need / max(rate, 1e-9)),
        "loader_config_workers": configured, "loader_config_img_per_s": gives,
        "loader_config_measured": at_config is not None,
        "loader_data_bound": gives < need,
        "loader_in_process": in_process(cfg),
    }


def format_rows(rows: list[dict[str, Any]]) -> str:
    """A fixed-width table: workers, img/s, img/s per worker, timed images and seconds."""
    head = ["workers", "loader img/s", "img/s/worker", "images", "seconds"]
    body = [[str(r["workers"]), f"{r['img_per_s']:.1f}", f"{r['img_per_s_per_worker']:.1f}", str(r["images"]),
             f"{r['seconds']:.2f}"] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    return "\n".join("  ".join(v.rjust(w) for v, w in zip(line, widths, strict=True)) for line in [head, *body])


def verdict_line(cfg: Any, v: dict[str, Any]) -> str:
    """The verdict in one line."""
    need, rate, cores = v["loader_need_img_per_s"], v["loader_per_worker_img_per_s"], v["loader_cores"]
    nw, w, gives = v["loader_workers_needed"], v["loader_config_workers"], v["loader_config_img_per_s"]
    bound = (f"data-bound at DATA.NUM_WORKERS {cfg.DATA.NUM_WORKERS}" if v["loader_data_bound"]
             else f"not data-bound at DATA.NUM_WORKERS {cfg.DATA.NUM_WORKERS}")
    resolved = f" ({w} worker{'s' if w != 1 else ''} on this rank)" if cfg.DATA.NUM_WORKERS < 0 else ""
    how = "measured" if v["loader_config_measured"] else "estimated"
    if v["loader_in_process"]:
        return (f"verdict: the step needs {need:.0f} img/s per rank; DATA.NAME {cfg.DATA.NAME} is read in the training"
                f" process (no workers at any DATA.NUM_WORKERS), at {gives:.0f} img/s: 0 workers needed; "
                f"{'data-bound' if v['loader_data_bound'] else 'not data-bound'}")
    more = f", more than the {cores} cores this rank has" if nw > cores else f", with the {cores} cores this rank has"
    return (f"verdict: the step needs {need:.0f} img/s per rank; at {rate:.0f} img/s per worker "
            f"(the {v['loader_per_worker_from']}-worker row) that is about {nw} worker{'s' if nw != 1 else ''}{more}; "
            f"{bound}{resolved}: the loader gives {gives:.0f} img/s there ({how})")
