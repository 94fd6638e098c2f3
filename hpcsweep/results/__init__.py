"""After and during a sweep: event reading, the report table, the plot, and the status view.

May import ``hpcsweep.config``, ``hpcsweep.files`` and ``hpcsweep.slurm``; never ``sweep``, ``trial``, ``train``
or a command module, and never torch (``status`` and ``report`` run on the login node).
"""
