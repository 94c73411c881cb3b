"""What a preparation shows while it runs: a progress bar (bytes and tokens per second) on a terminal, a plain line
per finished unit in a batch job's log."""

from __future__ import annotations

import sys
import time
from typing import Any

from attnres.runtime import say, terminal_ok


class PrepareProgress:
    def __init__(self, total_bytes: int, units: int, skipped: int, bar: bool | None = None):
        self.total, self.units, self.done_units = total_bytes, units, 0
        self.bytes = self.tokens = 0
        self.start = time.monotonic()
        self.bar = None
        if bar is None:
            bar = terminal_ok(sys.stderr)  # a terminal with a size: tqdm draws nothing on one of 0 columns
        if skipped:
            say(f"attnres data: {skipped} unit(s) already prepared, {units} to go")
        if bar:
            from tqdm import tqdm

            self.bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="prepare", file=sys.stderr)

    def add_bytes(self, n_bytes: int, n_tokens: int) -> None:
        self.set(self.bytes + n_bytes, self.tokens + n_tokens)

    def set(self, n_bytes: int, n_tokens: int) -> None:
        if self.bar is not None:
            self.bar.update(n_bytes - self.bytes)
            rate = n_tokens / max(time.monotonic() - self.start, 1e-9)
            self.bar.set_postfix_str(f"{rate / 1e6:.2f}M tok/s", refresh=False)
        self.bytes, self.tokens = n_bytes, n_tokens

    def unit_done(self, record: dict[str, Any]) -> None:
        self.done_units += 1
        if self.bar is None:
            elapsed = max(time.monotonic() - self.start, 1e-9)
            say(
                f"attnres data: unit {record['unit']} done ({self.done_units}/{self.units}), "
                f"{self.bytes / 2**20:,.0f} MiB read, {self.tokens:,} tokens, "
                f"{self.bytes / 2**20 / elapsed:.1f} MiB/s, {self.tokens / elapsed / 1e6:.2f}M tok/s"
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
