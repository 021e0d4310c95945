"""What a process does before and around training, torch-free until it asks for torch.

Modules:
    startup      prepare(): called by every entry point before torch loads (threads, malloc, timm's wandb)
    threads      torch's intra-op thread count and the OpenMP wait policy, chosen once from cores and load
    malloc       glibc's trim and mmap thresholds: freed memory kept for reuse (or not, when sharded)
    signalsafe   lines a signal handler asks for, written outside the handler
    serverstart, serverexit   imported first and last in the loader workers' fork server
    serverfork   a warm search segment forks that server from itself instead of a new interpreter
"""
