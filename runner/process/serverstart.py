"""Imported first inside the loader workers' fork server (runner/data/workerstart.py puts it at the head of the
server's preload), never by a run: the server skips timm's own `import wandb` as the run does
(runner.process.startup), and its malloc keeps freed memory as the run's does (runner.process.malloc), for the
workers it forks.
Where wandb is installed that import was 0.4 s of the server's preload on a 2-core machine, and the run's first
loader workers wait for the preload to end (docs/PERFORMANCE.md, "Speed, second round")."""
from __future__ import annotations

from runner.process import malloc
from runner.process.startup import skip_timms_wandb

skip_timms_wandb()
malloc.configure()
