"""Config-driven experiment runner for timm image models.

Importing runner (or any of its modules) changes nothing in the process: an entry point that trains,
evaluates or times a model calls `runner.process.startup.prepare()` first, before torch loads.
"""
