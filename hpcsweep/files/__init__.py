"""The files the stages hand each other: atomic writes, ``sweep.json``, ``metrics.json`` and the trial's TensorBoard run.

Also the files a user brings that the login node reads without torch: the lm-eval task folder (``task_files``).

Shared by every stage. May import only ``config``; never a stage or a command module, and no torch.
"""
