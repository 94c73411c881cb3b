"""The paper's numbers the report sets its own beside (Kimi Team, "Attention Residuals", arXiv 2603.15031, Table 2):
typed once here, never computed. Pure data; never imports torch."""

from __future__ import annotations

# Table 2's ladder: activated parameters and the tuned learning rate of each size (every variant trained at it)
TABLE2_PARAMS = (194e6, 241e6, 296e6, 436e6, 528e6)
TABLE2_LR = (2.99e-3, 2.80e-3, 2.50e-3, 2.20e-3, 2.02e-3)
TABLE2_NOTE = "the paper's Table 2 rates (activated parameters, its tokenizer and recipe)"
