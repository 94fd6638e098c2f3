"""How a worker's run is watched: where a step's time and memory go, traces, and what it leaves for its runner.

The step-time breakdown (``step_timer``), profiler traces of chosen steps (``profiling``), the memory plan
against the real device and the measured peak (``memory_record``), the progress, stacks and traceback each
worker leaves for its node's runner (``worker_records``), and torch's C++ warnings from rank 0 only
(``rank_logging``). Of ``train``, imports only this room and the base modules ``distributed``, ``fault`` and
``gpu_choices``; never ``trainer``, ``worker``, train's other top modules or any other room.
"""
