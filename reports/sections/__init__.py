"""The report's sections and tables: the headline, each sweep's section, the paper's, provenance, problems."""
