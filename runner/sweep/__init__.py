"""Sweeps: a sweep file (cfg, set, grid, points, root, search) becomes validated points with stable folder names.

spec (the file, read and checked like a config file) <- points (the crossing, folder names, train.py arguments,
every point's config built once) <- __main__ (`python -m runner.sweep`, for the bash launchers in tools/sweeps/).
Nothing here imports torch.
"""
