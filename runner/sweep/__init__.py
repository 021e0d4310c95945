"""Sweeps and searches: a sweep file (cfg, set, grid, points, root, search) becomes checked points, or a
search (ASHA or Hyperband) over an Optuna study, run by the launchers in tools/sweeps/.

Modules, imports running one way (each imports only those above it):
    spec     the sweep file, read and checked like a config file (yaml.safe_load, file:line in messages)
    points   the crossing, stable folder names, train.py's arguments; every point's config built once
    grid     `python -m runner.sweep grid`: a command line's --cfg/--grid written as a sweep file (ROOT/sweep.yaml)
    summary  the table of a folder of runs (tools/summarize.py): the rundir reader over each run
    asha     ASHA (promotions from the top rung down, new trials, repechage of paused trials)
    hyperband  asynchronous Hyperband: brackets that start at each rung, ASHA within each
    schedulers the table of schedulers (`search: scheduler:`): name -> module, `register`
    search   `search:`: the space, metric, mode, sampler, rungs, scheduler, checked against the config
    study    the Optuna study in ROOT/study.journal (the file journal: no server)
    worker   one worker: take a job under ROOT's lock, train it with --pause-after-epoch, report its rung
    warm, warmserver  each one-process segment forked from the worker's warm server (torch imported once)
    table, report  the trials' table and ROOT/report.html (self-contained)
    plan     `python -m runner.sweep plan`: rungs, trials per rung, epochs, nothing trained
    launch, launch_pool, launch_devices  `python -m runner.sweep run`: settings and plan; slots, signals, exit
             codes; GPUs and ports (tools/sweeps/run.sh runs it)
    cli, __main__  `python -m runner.sweep run|points|root|search|plan ...`
Nothing here imports torch (warmserver, a process of its own, does).
"""
