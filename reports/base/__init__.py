"""What every part of a report reads: the looks, the paper's numbers, the data of a fit, the words, the context."""
