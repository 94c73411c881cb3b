"""Training one run: the Lightning module (:mod:`~attnres.training.module`), the run itself with its folder,
locks and resume (:mod:`~attnres.training.run`), and its parquet log (:mod:`~attnres.training.run_log`)."""
