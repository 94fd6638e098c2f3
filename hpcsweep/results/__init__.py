"""After and during a sweep: event reading, the report table, the plot, and the status view.

May import only the shared packages; never ``sweep``, ``trial``, ``train`` or a command module, and never torch
(``status`` and ``report`` run on the login node).
"""
