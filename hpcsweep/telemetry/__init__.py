"""Per-trial GPU telemetry with no admin and no daemon: NVML (``nvidia-ml-py``) read by a thread on
each node's local rank 0, the workers' CPU and memory from ``/proc``, and their summaries.

``trial_telemetry.TrialTelemetry`` is what the trainer holds; the samplers take NVML and ``/proc``
as parameters, so they are tested with fakes and proved on a real GPU by ``benchmarks/gpu_check.py``.
No torch at import: the login node may read the summary's keys. May import only ``config``; never
a stage or a command module.
"""
