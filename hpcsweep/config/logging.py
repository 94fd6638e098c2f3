"""The ``logging`` group: the trackers (TensorBoard, MLflow, W&B) a trial's metrics go to besides metrics.json."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .validation import _require


TRACKER_BACKENDS = ("tensorboard", "mlflow", "wandb")
"""What ``logging.backends`` may name; TensorBoard needs nothing, the others their package
(``pip install -e .[mlflow]``, ``.[wandb]``)."""


@dataclass(kw_only=True)
class MlflowConfig:
    """MLflow tracking (``logging.backends`` names ``mlflow``; see ``hpcsweep.train.trackers.backends``)."""

    tracking_uri: str | None = None
    """Where runs go: ``http(s)://HOST:PORT`` of an MLflow server, ``sqlite:///PATH``, or a
    ``file:`` folder. null: a SQLite store in the sweep dir (``SWEEP_DIR/mlflow.db``), so a sweep
    needs no server."""
    experiment: str | None = None
    """The MLflow experiment every trial of the sweep logs to. null: one experiment per sweep,
    named after the sweep dir."""

    def __post_init__(self) -> None:
        if self.tracking_uri is not None:
            _require(
                tracking_uri_problem(self.tracking_uri) is None,
                "logging.mlflow.tracking_uri",
                self.tracking_uri,
                tracking_uri_problem(self.tracking_uri) or "",
            )
        _require(self.experiment is None or bool(self.experiment.strip()), "logging.mlflow.experiment",
                 self.experiment, "null (one experiment per sweep) or a non-empty name")


def tracking_uri_problem(uri: str) -> str | None:
    """Why ``uri`` is no MLflow tracking URI we can use (None when it is one)."""
    scheme, sep, rest = uri.partition(":")
    allowed = "http://HOST:PORT, https://HOST:PORT, sqlite:///PATH, postgresql://..., mysql://..., or file:///PATH"
    if not sep or not rest:
        return f"a URI: {allowed}"
    base = scheme.split("+", 1)[0]
    if base in ("http", "https"):
        host = rest.removeprefix("//").split("/", 1)[0]
        return None if rest.startswith("//") and host else f"http(s)://HOST[:PORT]: {allowed}"
    if base in ("sqlite", "postgresql", "mysql", "mssql"):
        return None if rest.startswith("//") else f"{base}://...: {allowed}"
    if base == "file":
        return None
    return f"one of the schemes MLflow stores runs in: {allowed}"


@dataclass(kw_only=True)
class WandbConfig:
    """Weights & Biases tracking (``logging.backends`` names ``wandb``)."""

    project: str = "hpcsweep"
    """The W&B project of every trial's run."""
    entity: str | None = None
    """The W&B user or team; null: the account's default."""
    mode: Literal["auto", "offline", "online"] = "auto"
    """``offline``: runs are written under the trial dir, uploaded later with the ``wandb sync``
    command ``status`` and ``report`` print; ``online``: streamed as they run; ``auto``: offline
    when the trial runs on a Slurm node (compute nodes often reach no internet), else online."""


@dataclass(kw_only=True)
class LoggingConfig:
    """Where a trial's metrics go besides metrics.json: TensorBoard, MLflow, W&B (rank 0 only)."""

    backends: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Any of tensorboard, mlflow, wandb. Each trial is one run of each tracker, grouped by sweep,
    continued when the trial is requeued or resumed; a failing tracker never fails the trial."""
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def __post_init__(self) -> None:
        allowed = ", ".join(TRACKER_BACKENDS)
        _require(
            len(self.backends) == len(set(self.backends)) and all(b in TRACKER_BACKENDS for b in self.backends),
            "logging.backends", self.backends, f"a list of distinct names among {allowed}, e.g. [tensorboard,mlflow]",
        )
