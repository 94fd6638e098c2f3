"""What a trial reports as it trains: its TensorBoard scalars and the MLflow and W&B runs beside them.

The fixed tags, the GPU peaks and MFU, and the TensorBoard logger (``metrics``); the loggers a trial's
``logging.backends`` names, fanned out on rank 0 with each tracker guarded (``backends``) and on its own
thread (``thread``); each tracker's run, decided from the trial dir (``tracked_run``), and its client
(``mlflow_logger``, ``wandb_logger``). Of ``train``, imports only this room and the base modules
``distributed``, ``fault`` and ``gpu_choices``; never ``trainer``, ``worker``, train's other top modules or
any other room.
"""
