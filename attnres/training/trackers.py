"""Experiment trackers beside the parquet record: Lightning's own loggers, chosen by ``runtime.logger``.

The parquet files stay what the analysis reads; a tracker is for watching runs (TensorBoard, a W&B or MLflow
dashboard). Each writes under the run folder unless told otherwise, names the run by its run id and the
experiment by its sweep, so a resumed run continues the same tracker run. wandb and mlflow are optional extras
(``pip install 'attnres-scaling[wandb]'`` / ``[mlflow]``); wandb runs offline unless ``WANDB_MODE`` says otherwise,
because compute nodes often have no internet (``wandb sync RUN_DIR/wandb/offline-run-*`` uploads later).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from attnres.config import ConfigError, RunConfig, to_dict

# logger -> (the module it needs, the extra that installs it)
NEEDS = {"tensorboard": ("tensorboardX", "tensorboard"), "wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}


def check_tracker(cfg: RunConfig) -> None:
    """One clear error before any compute when the chosen tracker's package is not installed."""
    name = cfg.runtime.logger
    if name not in NEEDS:
        return
    module, extra = NEEDS[name]
    if importlib.util.find_spec(module) is None and not (name == "tensorboard" and importlib.util.find_spec(name)):
        raise ConfigError(
            f"runtime.logger={name} needs the {module} package, which is not installed: "
            f"pip install 'attnres-scaling[{extra}]' (or pip install {module}), or use runtime.logger=csv"
        )


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def build_tracker(cfg: RunConfig, run_dir: Path) -> Any:
    """The Lightning logger for ``runtime.logger`` (False for none), with the run's config as hyper-parameters."""
    name = cfg.runtime.logger
    if name == "none":
        return False
    check_tracker(cfg)
    run_dir = Path(run_dir)
    if name == "csv":
        from lightning.pytorch.loggers import CSVLogger

        tracker = CSVLogger(save_dir=run_dir, name="csv", version="")
    elif name == "tensorboard":
        from lightning.pytorch.loggers import TensorBoardLogger

        tracker = TensorBoardLogger(save_dir=run_dir, name="tensorboard", version="", default_hp_metric=False)
    elif name == "wandb":
        from lightning.pytorch.loggers import WandbLogger

        tracker = WandbLogger(
            save_dir=str(run_dir),
            project=os.environ.get("WANDB_PROJECT", "attnres"),
            group=cfg.sweep,
            name=cfg.run_id,
            id=cfg.run_id,
            resume="allow",
            offline=os.environ.get("WANDB_MODE", "offline") == "offline",
        )
    else:
        from lightning.pytorch.loggers import MLFlowLogger

        tracker = MLFlowLogger(
            experiment_name=cfg.sweep,
            run_name=cfg.run_id,
            tracking_uri=os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / "mlruns").resolve().as_uri(),
        )
    tracker.log_hyperparams(_flat(to_dict(cfg)))
    return tracker
