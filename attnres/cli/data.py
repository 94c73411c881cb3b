"""``attnres data prepare SOURCE --tokenizer SPEC --out DIR``: raw text to token shards, once."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("data", help="prepare training data: raw text to token shards")
    commands = parser.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")
    prep = commands.add_parser(
        "prepare",
        help="tokenize a corpus into shards and a manifest (resumable; concurrent runs build it once)",
        description="Tokenize SOURCE (builtin, a file, a folder or a glob of .txt, .txt.gz, .jsonl, .jsonl.gz, "
        ".parquet) into DIR: token shards that training reads as memory maps, and manifest.json. Run it again "
        "after a kill and it resumes; a second copy started on the same DIR waits for the first. Train on it with "
        "data.corpus=DIR. See docs/data.md.",
    )
    prep.add_argument("source", metavar="SOURCE")
    prep.add_argument("--out", required=True, metavar="DIR", help="the prepared folder (new, or one to resume)")
    prep.add_argument(
        "--tokenizer",
        default="bytes",
        metavar="SPEC",
        help="bytes (default), bpe:<vocab> (train a BPE on a sample, e.g. bpe:8192) or the path of a tokenizer.json",
    )
    prep.add_argument("--workers", type=int, default=1, help="processes tokenizing in parallel (default 1)")
    prep.add_argument("--text-field", default="text", help="jsonl field / parquet column with the text (text)")
    prep.add_argument("--val-fraction", type=float, default=0.02, help="share of pieces held out (0.02)")
    prep.add_argument("--chunk-bytes", type=int, default=8192, help="chunk size long documents are cut into (8192)")
    prep.add_argument("--split-seed", type=int, default=1234, help="seed of the split (1234)")
    prep.add_argument(
        "--unit-mib", type=float, default=256, help="input per unit of work, one shard per split each (256 MiB)"
    )
    prep.add_argument("--sample-mib", type=float, default=64, help="text sampled to train a BPE tokenizer (64 MiB)")
    prep.add_argument("--no-progress", action="store_true", help="plain log lines instead of a progress bar")
    prep.set_defaults(func=run_prepare)


def run_prepare(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from attnres.data.prepare import MANIFEST, PrepareSpec, prepare

    spec = PrepareSpec(
        source=args.source,
        tokenizer=args.tokenizer,
        text_field=args.text_field,
        val_fraction=args.val_fraction,
        chunk_bytes=args.chunk_bytes,
        split_seed=args.split_seed,
        unit_bytes=int(args.unit_mib * 2**20),
        sample_bytes=int(args.sample_mib * 2**20),
    )
    out = prepare(spec, Path(args.out), args.workers, progress=False if args.no_progress else None, label="SOURCE")
    manifest = json.loads((out / MANIFEST).read_text())
    splits = manifest["splits"]
    print(
        f"prepared {out}: {manifest['tokenizer']['spec']} (vocabulary {manifest['vocab_size']:,}), "
        f"train {splits['train']['tokens']:,} tokens in {len(splits['train']['shards'])} shard(s), "
        f"val {splits['val']['tokens']:,} tokens, "
        + (
            f"{splits['train']['bytes'] / splits['train']['tokens']:.3f} bytes per token"
            if splits["train"]["bytes"]
            else "token ids as given"
        )
        + f"; train on it with data.corpus={out}"
    )
    return 0
