"""The files the stages hand each other: atomic writes, ``sweep.json``, ``metrics.json`` and the trial's TensorBoard run.

Shared by every stage, so it imports nothing of hpcsweep but ``hpcsweep.config``; no torch.
"""
