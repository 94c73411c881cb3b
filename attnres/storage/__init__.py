"""What a run leaves on disk and how it is written: the parquet contract with atomic writes
(:mod:`~attnres.storage.schema`) and the flock files that keep two processes off one folder
(:mod:`~attnres.storage.locks`). No torch: the analysis and the launchers' status commands use them."""
