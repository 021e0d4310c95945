"""The timing and counting back-ends of tools/benchmark.py and tools/flops.py: `step` (the training step's
img/s through the real loop), `loader` (a data source's loader alone), `flops` (a model's FLOPs per image)."""
