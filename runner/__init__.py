"""Config-driven experiment runner for timm image models.

Importing runner (or any of its modules) changes nothing in the process: an entry point that trains,
evaluates or times a model calls `runner.process.startup.prepare()` first, before torch loads.

The layout is flat where a piece is one module and a package where it is several; each imports only its own
layer and those below (docs/ARCHITECTURE.md, checked by tests/test_structure.py), lowest first:
    0  process/ (start-up, threads, malloc, the loader fork server), errors, compat, fsutil, csvsafe, keys
    1  config/, optim                 the config and what each key accepts; optimizers and LR schedules
    2  rundir/                        the run folder's layout, marker, lock and rules (torch-free)
    3  distributed, checkpoint, model, fsdp, distill, profiler, sinks/, weights/   what a run is built from
    4  data/, preflight               data sources and loaders; the checks made before a folder is claimed
    5  engine/                        the loop, its hooks and their shared run state, the wiring of a run
    6  sweep/, bench/, export         sweeps and searches, the tools' timing back-ends, exports
"""
