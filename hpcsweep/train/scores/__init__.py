"""Task scores: lm-evaluation-harness on the model a trial holds, as it trains (``task_scorer``).

The login node's check of the task folder is ``hpcsweep.files.task_files`` (no torch, no lm-eval). Of
``train``, imports only this room and the base modules ``distributed``, ``fault`` and ``gpu_choices``; never
``trainer``, ``worker``, train's other top modules or any other room.
"""
