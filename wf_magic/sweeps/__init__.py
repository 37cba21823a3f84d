"""Sweeps: one workflow over a grid of params × dataset rows × repeats, each cell a run, driven
under one budget, durable in the ``sweeps`` / ``sweep_cells`` tables, read as one frame."""
