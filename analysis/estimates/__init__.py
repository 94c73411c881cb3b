"""The estimates of one study: multipliers (shared, paired, local, frontier), depth, one shape, architecture."""
