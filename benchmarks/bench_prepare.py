"""Throughput and peak memory of `attnres data prepare` on a generated corpus, and a check of its tokens.

    python benchmarks/bench_prepare.py                          # 2 GB, bpe:8192, --workers 2 (several minutes)
    python benchmarks/bench_prepare.py --size-gb 0.2 --workers 1 --tokenizer bytes

The script writes a text folder of ``--size-gb`` (lines drawn with a fixed seed from the built-in corpus, in 64 MB
files; never committed, deleted afterwards unless ``--keep``), runs ``attnres data prepare`` on it as a user would
(a subprocess), samples the resident memory of its whole process tree (the command and its workers, summed) every
0.1 s, and prints bytes and tokens per second and the peak. Then it checks the tokens: for ``--verify`` files (all
with ``--verify 0``) it tokenizes the file's text in one process in one go and compares it with what the
preparation wrote (the file's train and validation pieces put back in order).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnres.data.prepare import MANIFEST, unit_tokens_in_order  # noqa: E402
from attnres.data.sources import source_files  # noqa: E402
from attnres.data.tokenizer import bytes_tokenizer, load_tokenizer_file  # noqa: E402

FILE_BYTES = 64 * 2**20


def generate(folder: Path, total_bytes: int, seed: int = 0) -> list[Path]:
    lines = []
    for path in source_files("builtin"):
        lines += [line for line in gzip.decompress(path.read_bytes()).split(b"\n") if line.strip()]
    rng = np.random.default_rng(seed)
    files, written = [], 0
    folder.mkdir(parents=True, exist_ok=True)
    while written < total_bytes:
        path = folder / f"part-{len(files):04d}.txt"
        size = min(FILE_BYTES, total_bytes - written)
        with open(path, "wb") as f:
            n = 0
            while n < size:
                block = b"\n".join(lines[i] for i in rng.integers(0, len(lines), 20_000)) + b"\n"
                f.write(block[: size - n] if n + len(block) > size else block)
                n += len(block)
        written += path.stat().st_size
        files.append(path)
    return files


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        stack += children.get(p, [])
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--tokenizer", default="bpe:8192")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--verify", type=int, default=4, help="files to check against one-go tokenization (0: all)")
    parser.add_argument("--dir", help="where to generate (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()

    root = Path(args.dir or tempfile.mkdtemp(prefix="attnres-bench-prepare-"))
    try:
        t0 = time.perf_counter()
        files = generate(root / "text", int(args.size_gb * 1e9))
        total = sum(f.stat().st_size for f in files)
        print(f"generated {total / 1e9:.2f} GB in {len(files)} files in {time.perf_counter() - t0:.0f} s")
        out = root / "prepared"
        # one unit per file, so that each file's tokens can be put back together for the check
        cmd = [sys.executable, "-m", "attnres.cli", "data", "prepare", str(root / "text"), "--out", str(out)]
        cmd += ["--tokenizer", args.tokenizer, "--workers", str(args.workers), "--no-progress"]
        cmd += ["--unit-mib", str(FILE_BYTES / 2**20)]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, tree_rss(proc.pid))
            time.sleep(0.1)
        elapsed = time.perf_counter() - t0
        log = proc.stderr.read()
        if proc.returncode:
            print(log)
            return 1
        manifest = json.loads((out / MANIFEST).read_text())
        tokens = sum(manifest["splits"][s]["tokens"] for s in ("train", "val"))
        print(
            f"prepare {args.tokenizer} --workers {args.workers}: {elapsed:.0f} s, {total / 2**20 / elapsed:.1f} MiB/s, "
            f"{tokens / elapsed / 1e6:.2f}M tokens/s, {tokens:,} tokens, "
            f"{total / tokens:.2f} bytes per token; peak RSS {peak / 2**30:.2f} GiB (all processes)"
        )
        tokenizer = bytes_tokenizer() if args.tokenizer == "bytes" else load_tokenizer_file(out / "tokenizer.json", "x")
        check = (
            files if args.verify == 0 else [files[i] for i in np.linspace(0, len(files) - 1, args.verify, dtype=int)]
        )
        for path in check:
            unit = files.index(path)
            whole = np.append(tokenizer.encode_text(path.read_text()), tokenizer.eot_id)
            same = np.array_equal(unit_tokens_in_order(out, unit).astype(np.int64), whole.astype(np.int64))
            print(f"  {path.name}: {len(whole):,} tokens, equal to one-go tokenization: {same}")
            if not same:
                return 1
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
