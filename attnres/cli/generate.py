"""``attnres generate RUN_DIR_or_CKPT --prompt TEXT``: text sampled from a trained run, with a KV cache."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "generate",
        help="sample text from a trained run (its checkpoint and tokenizer)",
        description="Continue a prompt with a trained run's model: the prompt is tokenized with the run's own "
        "tokenizer, prefilled into a KV cache, and continued one token at a time. A sample ends at the end-of-text "
        "token or after --max-new-tokens; the prompt plus the new tokens must fit the model's context (seq_len).",
    )
    parser.add_argument("path", metavar="RUN_DIR_or_CKPT", help="a run folder (its checkpoints/last.ckpt) or a .ckpt")
    parser.add_argument("--prompt", default="", help="the text to continue (default: a new document)")
    parser.add_argument("--max-new-tokens", type=int, default=100, help="at most this many new tokens (default 100)")
    parser.add_argument("--temperature", type=float, default=0.8, help="0 picks the most likely token (default 0.8)")
    parser.add_argument("--top-k", type=int, default=None, help="draw from the K most likely tokens only")
    parser.add_argument("--samples", type=int, default=1, help="samples of the same prompt, decoded as one batch")
    parser.add_argument("--seed", type=int, default=0, help="the sampling seed (default 0)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when there is one)")
    parser.set_defaults(func=run)


def _check(args: argparse.Namespace) -> None:
    from attnres.config import ConfigError

    for name, value, low in (("--max-new-tokens", args.max_new_tokens, 1), ("--samples", args.samples, 1)):
        if value < low:
            raise ConfigError(f"{name} {value}: give at least {low}")
    if not args.temperature >= 0:
        raise ConfigError(f"--temperature {args.temperature}: give 0 (the most likely token) or a positive number")
    if args.top_k is not None and args.top_k < 1:
        raise ConfigError(f"--top-k {args.top_k}: give at least 1, or leave it out to draw from every token")


def run(args: argparse.Namespace) -> int:
    _check(args)
    import torch

    from attnres.config import ConfigError
    from attnres.decoding import generate, load_trained

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    trained = load_trained(args.path, device)
    tok, seq_len = trained.tokenizer, trained.cfg.model.seq_len
    ids = tok.encode_text(args.prompt).tolist() if args.prompt else [tok.eot_id]  # no prompt: a document's start
    if len(ids) >= seq_len:
        raise ConfigError(
            f"the prompt is {len(ids)} tokens; the model's context is seq_len={seq_len}, so a prompt may have at most "
            f"{seq_len - 1} tokens: shorten it"
        )
    state = "" if trained.finished else " (the run has not finished)"
    print(
        f"{trained.cfg.run_id}: {trained.cfg.model.variant}, step {trained.step}{state}, {trained.checkpoint}",
        file=sys.stderr,
    )
    prompt = torch.tensor([ids] * args.samples, device=device)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    new = generate(
        trained.model,
        prompt,
        min(args.max_new_tokens, seq_len - len(ids)),
        args.temperature,
        args.top_k,
        generator,
        stop=tok.eot_id,
    )
    if args.max_new_tokens > seq_len - len(ids):
        print(f"(stopped at the context's end: seq_len={seq_len})", file=sys.stderr)
    for i, row in enumerate(new.tolist()):
        text = tok.decode(row[: row.index(tok.eot_id)] if tok.eot_id in row else row)
        if args.samples > 1:
            print(f"--- sample {i + 1}")
        print(args.prompt + text)
    return 0
