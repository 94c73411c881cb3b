"""One function per figure: each takes the fit or the runs and returns a matplotlib Figure."""
