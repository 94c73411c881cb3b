"""The laws and their fitting on arrays: the law forms, their models, the robust optimizer, the fits."""
