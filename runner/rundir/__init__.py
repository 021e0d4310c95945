"""The run folder: its layout, its marker (run.json), its lock, status and results, and the rules for
claiming, resuming and refusing a folder.

`layout` names every file once; everything here that a tool needs is torch-free.
"""
