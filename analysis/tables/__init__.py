"""The fit's text and tables, and the output folder it is written into."""
