"""A results tree fitted: the settings, the checks, the records of the fit and the steps that make them."""
