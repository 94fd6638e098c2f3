"""Trials in a site's container runtime, as the login node sees it: the ``hydra.launcher.container``
settings and their refusals (``settings``), the paths mounted at the same path inside (``mounts``), each
runtime's flags written by one pure function (``flags``: pyxis's ``srun --container-*``, Apptainer's
``apptainer exec`` prefix, Slurm OCI's ``--container=BUNDLE``), and what the login node can check before
anything is queued (``checks``: the image, the mount sources, a local runtime); and what a trial's
``environment.json`` says of its container (``record``: the image's identity at submission, the OS release
seen inside). No torch, no Slurm call.

May import only ``config``; never a stage or a command module. ``sweep`` wires it into what a sweep submits.
"""
