"""The paper's numbers the report sets its own beside (Kimi Team, "Attention Residuals", arXiv 2603.15031): its
published fits and headline multiplier, the regime behind that headline, its Table 2 ladder and its Table 4
ablations. Typed once here, never computed from our runs: every figure, table and sentence of the report that
quotes the paper reads its numbers from this module. Pure data; never imports torch."""

from __future__ import annotations

# Table 2's ladder: activated parameters and the tuned learning rate of each size (every variant trained at it)
TABLE2_PARAMS = (194e6, 241e6, 296e6, 436e6, 528e6)
TABLE2_LR = (2.99e-3, 2.80e-3, 2.50e-3, 2.20e-3, 2.02e-3)
TABLE2_NOTE = "the paper's Table 2 rates (activated parameters, its tokenizer and recipe)"

# The published fits, L = A * C^-alpha with C in PFLOP/s-days (their data, their tokenizer).
PAPER_FITS = {"baseline": (1.891, 0.057), "block": (1.870, 0.058), "full": (1.865, 0.057)}
PAPER_ALPHA = PAPER_FITS["baseline"][1]  # the baseline's published exponent
PAPER_BLOCK_N = 8  # about how many blocks the paper's Block AttnRes has (its fits' legend says N≈8)
PAPER_RANGE = (0.45, 6.5)  # PFLOP/s-days, about the span of the paper's five sizes (their FLOP count)
PAPER_HEADLINE_C = 5.6  # PFLOP/s-days: where the paper quotes "Block matches 1.25x the baseline's compute"
PAPER_M = 1.25  # Block AttnRes at C = 5.6 PFLOP/s-days, from the paper's fits

# The regime behind the paper's headline (reports.sections.regime): tokens per activated parameter at the smallest and
# the largest size, and Block's loss minus the baseline's at the largest size (528M, Table 2), in % (-1.5)
PAPER_TOKENS_PER_PARAM = (38.7e9 / TABLE2_PARAMS[0], 119.0e9 / TABLE2_PARAMS[-1])
PAPER_GAP_PCT = 100 * (1.693 / 1.719 - 1)

# Table 4 (the 436M model, their data): the loss of each ablation; the report prints each minus the baseline's
PAPER_TABLE4_PARAMS = TABLE2_PARAMS[3]
PAPER_TABLE4_BLOCK_SIZE = 4  # the block size S of Table 4's plain Block row
PAPER_TABLE4_BASELINE = 1.766
PAPER_TABLE4 = {
    "denseformer": 1.767,
    "mhc4": 1.747,
    "full": 1.737,
    "full+input_query": 1.731,
    "full+scalar": 1.749,
    "full+sigmoid": 1.741,
    "full+no_key_norm": 1.743,
    "full+window8": 1.764,
    "block": 1.746,  # at S = PAPER_TABLE4_BLOCK_SIZE
    "block+heads16": 1.752,
    "block+no_key_norm": 1.750,
}
