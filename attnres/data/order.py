"""The order training windows are read in (``train.sampler``): pure functions of (seed, step), on any number of
devices.

* ``replacement`` (the default, and the order of every committed study): step s draws its ``batch_size`` window
  starts uniformly from the training split with ``PCG64([seed, s])``, independently of every other step. Simple and
  exact to resume, but a run as long as the split reads only about 63 % of it (1 - 1/e) and reads the rest twice or
  more (:func:`repeat_fraction`).
* ``epoch``: the split is cut into ``(len - 1) // seq_len`` window slots (window k reads tokens
  ``[k * seq_len, (k + 1) * seq_len]``, so consecutive windows share the one token the first predicts last), and
  the run's i-th window overall (i = step * batch_size + row) is slot ``P_e(i mod n)`` of epoch ``e = i // n``,
  where ``P_e`` is a permutation of the slots keyed by (seed, e). Every slot is read once per epoch, and epoch e + 1
  reads them in another order. ``P_e`` is a Feistel network with cycle walking, so a window's slot is computed
  from its index alone: no permutation of the whole split is ever held in memory, and a resumed run, or a rank of
  many, computes exactly the windows it needs.

Both orders hand rank r of w the rows r, r + w, ... of each global batch, so the batches a run trains on do not
depend on how many devices run it.
"""

from __future__ import annotations

import numpy as np

SAMPLERS = ("replacement", "epoch")
FEISTEL_ROUNDS = 6  # four rounds already make a pseudo-random permutation (Luby-Rackoff); two spare
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray, key: np.uint64) -> np.ndarray:
    """A 64-bit mixing function of (x, key) (splitmix64's finaliser): the Feistel round function."""
    z = (x ^ key) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _round_keys(seed: int, epoch: int) -> np.ndarray:
    return np.random.SeedSequence([seed, epoch, 0xFE157E1]).generate_state(FEISTEL_ROUNDS, dtype=np.uint64)


def permute(index: np.ndarray, n: int, seed: int, epoch: int) -> np.ndarray:
    """``P(index)`` for the seeded permutation P of ``range(n)`` of (seed, epoch): a balanced Feistel network on the
    smallest even number of bits holding n, applied again to any value that lands at or above n (cycle walking,
    which keeps it a permutation of range(n); the domain is under 4n, so a few passes at most)."""
    index = np.asarray(index, dtype=np.uint64)
    if n <= 1:
        return np.zeros_like(index)
    half = max(1, (int(n - 1).bit_length() + 1) // 2)
    low = np.uint64((1 << half) - 1)
    shift = np.uint64(half)
    keys = _round_keys(seed, epoch)
    with np.errstate(over="ignore"):  # the mixing multiplies modulo 2^64 on purpose

        def once(x: np.ndarray) -> np.ndarray:
            left, right = x >> shift, x & low
            for key in keys:
                left, right = right, left ^ (_mix(right, key) & low)
            return (left << shift) | right

        out = once(index)
        outside = out >= np.uint64(n)
        while outside.any():
            out[outside] = once(out[outside])
            outside = out >= np.uint64(n)
    return out.astype(np.int64)


def window_slots(n_tokens: int, seq_len: int) -> int:
    """How many windows of seq_len + 1 tokens the ``epoch`` order cuts a split of ``n_tokens`` into."""
    return (n_tokens - 1) // seq_len


def batch_starts(sampler: str, n_tokens: int, seq_len: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """The start token of each window of global batch ``step`` (all ranks' rows)."""
    if sampler == "replacement":
        rng = np.random.Generator(np.random.PCG64([seed, step]))
        return rng.integers(0, n_tokens - seq_len - 1, size=batch_size, endpoint=True)
    if sampler != "epoch":
        raise ValueError(f"unknown sampler {sampler!r}; choose one of {', '.join(SAMPLERS)}")
    n = window_slots(n_tokens, seq_len)
    index = step * batch_size + np.arange(batch_size, dtype=np.int64)
    epoch, position = np.divmod(index, n)
    slots = np.empty(batch_size, dtype=np.int64)
    for e in np.unique(epoch):  # a batch spans two epochs at most
        mine = epoch == e
        slots[mine] = permute(position[mine], n, seed, int(e))
    return slots * seq_len


def epochs(windows: int, n_tokens: int, seq_len: int) -> float:
    """Passes over a split of ``n_tokens`` that ``windows`` windows of seq_len tokens make."""
    return windows * seq_len / max(1, n_tokens - 1)


def repeat_fraction(sampler: str, windows: int, n_tokens: int, seq_len: int) -> float:
    """The expected fraction of the tokens a run reads that it has read before.

    ``epoch``: everything past the first epoch, 1 - 1/E for E epochs above 1. ``replacement``: a token is read by
    a window starting in the seq_len positions before it, so after E epochs' worth of windows it has been read
    with probability 1 - exp(-E) and the run has read E times the split: 1 - (1 - exp(-E)) / E (0.37 at E = 1).
    """
    e = epochs(windows, n_tokens, seq_len)
    if e <= 0:
        return 0.0
    if sampler == "epoch":
        return max(0.0, 1.0 - 1.0 / e)
    return 1.0 - (-np.expm1(-e)) / e
