"""The run folder: its layout, its marker (run.json), its lock, status and results, and the rules for
claiming, resuming and refusing a folder.

Modules, imports running one way (each imports only those above it):
    layout       every file and folder name a run writes, defined once (step_N.pth, results-step<N>.json too)
    lock         run.lock: one job per folder, its holder named in one format
    marker       run.json (format version, statuses, is_our_run) and results.json
    checkpoints  finding checkpoints by name: step files, last.pth (what one holds: runner/checkpoint.py)
    reader       the one reader of a finished or running folder: status, results, metrics rows, stored config,
                 state in one word (`python -m runner.rundir state DIR` for shell scripts)
    rules        refusals (not ours, mixing two runs, a changed config), finished_run, done_line, extension
    envinfo      env.txt: versions, devices and the environment a run started in (torch imported when asked)

All of it is torch-free at import: tools/train.py skips a finished run with `rules` before torch loads. The act of
claiming a folder (the lock under the process group, loading the checkpoint into the trainer) is the engine's:
runner/engine/claim.py, following these rules.
"""
