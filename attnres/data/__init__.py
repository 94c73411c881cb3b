"""Training text as tokens: the built-in corpus (``builtin/``) or the user's files, split and cached
(:mod:`~attnres.data.corpus`)."""
