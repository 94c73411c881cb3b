"""The tokenizers a corpus can be prepared with: raw bytes, a BPE trained here, or a ``tokenizer.json`` on disk.

A spec names one (``data.tokenizer``, ``attnres data prepare --tokenizer``):

* ``bytes``: one token per UTF-8 byte, vocabulary 256. The end-of-text token is byte 0 (NUL), which text never
  holds (a source with NUL bytes is refused as binary), so the vocabulary stays 256 and bits per byte is exactly
  the loss in bits.
* ``bpe:<vocab>``: a byte-level BPE trained with Hugging Face ``tokenizers`` on a bounded, seeded sample of the
  source, saved as ``tokenizer.json`` beside the shards. Its end-of-text token is ``<|endoftext|>`` (id 0).
* a path to a ``tokenizer.json`` (GPT-2's, Llama's, ...), loaded from disk; its end-of-text token is the first of
  :data:`EOT_NAMES` it defines.

Nothing is downloaded. ``tokenizers`` is imported only for the BPE specs.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnres.data.errors import DataError

EOT_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "<|im_end|>")
BPE_EOT = "<|endoftext|>"
MIN_BPE_VOCAB = 260  # 256 byte tokens, the end-of-text token, and a few merges
MAX_VOCAB = 2**32 - 1
# A BPE trained here: the largest vocabularies in use are about 256k, and a sample rarely yields even that many
# distinct tokens; above this the model's embedding, not the text, would decide the run's memory.
MAX_BPE_VOCAB = 2**20
BYTES_HASH = hashlib.sha256(b"attnres bytes tokenizer v1").hexdigest()


def parse_spec(spec: str) -> tuple[str, Any]:
    """("bytes", None), ("bpe", vocab), ("tokens", vocab) or ("file", Path); a clear error for anything else."""
    text = str(spec).strip()
    if text == "bytes":
        return "bytes", None
    if text.startswith("tokens:"):
        size = text[7:].replace("_", "")
        if not size.isdigit() or not 2 <= int(size) <= MAX_VOCAB:
            raise DataError(f"tokenizer {spec!r}: tokens:<vocab> takes the vocabulary size of the token files")
        return "tokens", int(size)
    if text.startswith("bpe:"):
        size = text[4:].replace("_", "")
        if not size.isdigit() or not MIN_BPE_VOCAB <= int(size) <= MAX_BPE_VOCAB:
            raise DataError(
                f"tokenizer {spec!r}: bpe:<vocab> takes a vocabulary size from {MIN_BPE_VOCAB} to {MAX_BPE_VOCAB:,}, "
                "e.g. bpe:8192"
            )
        return "bpe", int(size)
    path = Path(text).expanduser()
    if path.suffix == ".json" or path.is_file():
        if not path.is_file():
            raise DataError(f"tokenizer file {str(path)!r} does not exist; give the path of a tokenizer.json")
        return "file", path
    raise DataError(
        f"unknown tokenizer {spec!r}; use bytes, bpe:<vocab> (e.g. bpe:8192), the path of a tokenizer.json, or "
        "tokens:<vocab> for files that hold token ids already"
    )


def token_dtype(vocab_size: int) -> np.dtype:
    """uint8 for bytes, uint16 up to 65,536 tokens, uint32 above."""
    if vocab_size <= 256:
        return np.dtype(np.uint8)
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.uint32)


@dataclass
class Tokenizer:
    """Text pieces to token arrays. ``hash`` identifies the mapping (part of every shard's header)."""

    spec: str
    vocab_size: int
    eot_id: int
    hash: str
    json: str | None = None  # the tokenizer.json text (BPE specs)
    _hf: Any = None

    @property
    def dtype(self) -> np.dtype:
        return token_dtype(self.vocab_size)

    def encode_text(self, text: str) -> np.ndarray:
        """One text tokenized in one call, no special tokens added (what the checks compare pieces against)."""
        if self._hf is None:
            return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        return np.asarray(self._hf.encode(text, add_special_tokens=False).ids, dtype=self.dtype)

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids back to text (bytes: UTF-8, a sequence cut mid-character shown as U+FFFD)."""
        if self._hf is None:
            return bytes(int(i) for i in ids).decode("utf-8", errors="replace")
        return self._hf.decode([int(i) for i in ids], skip_special_tokens=False)

    def encode(self, pieces: Sequence[Any]) -> list[np.ndarray]:
        """Each piece (UTF-8 bytes, already validated; token arrays for ``tokens:``) as its own token array."""
        if self.spec.startswith("tokens:"):
            return [np.asarray(p, dtype=np.int64) for p in pieces]
        if self._hf is None:
            return [np.frombuffer(p, dtype=np.uint8) for p in pieces]
        encodings = self._hf.encode_batch_fast([p.decode("utf-8") for p in pieces], add_special_tokens=False)
        return [np.asarray(e.ids, dtype=self.dtype) for e in encodings]


def bytes_tokenizer() -> Tokenizer:
    return Tokenizer("bytes", 256, 0, BYTES_HASH)


def builtin_tokenizer(spec: str) -> Tokenizer | None:
    """The tokenizers that need no file: bytes, and ``tokens:<vocab>`` (token ids read as they are; no end-of-text
    token is added, the files carry their own separators)."""
    kind, value = parse_spec(spec)
    if kind == "bytes":
        return bytes_tokenizer()
    if kind == "tokens":
        return Tokenizer(spec, value, -1, hashlib.sha256(f"attnres token ids, vocabulary {value}".encode()).hexdigest())
    return None


def from_json(spec: str, text: str, where: str) -> Tokenizer:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread per worker: --workers sets the parallelism
    from tokenizers import Tokenizer as HFTokenizer

    try:
        hf = HFTokenizer.from_str(text)
    except Exception as err:  # the library raises its own exception type for every kind of bad file
        raise DataError(f"{where} is not a tokenizer.json the tokenizers library can read: {err}") from None
    vocab = hf.get_vocab(with_added_tokens=True)
    eot = next((vocab[name] for name in EOT_NAMES if name in vocab), None)
    if eot is None:
        raise DataError(
            f"{where} defines no end-of-text token (looked for {', '.join(EOT_NAMES)}); add one as a special token"
        )
    size = max(hf.get_vocab_size(with_added_tokens=True), max(vocab.values()) + 1)
    kind, requested = parse_spec(spec) if spec.startswith("bpe:") else ("file", None)
    if kind == "bpe":  # a small corpus can run out of merges: the vocabulary is still the one asked for
        size = max(size, requested)
    return Tokenizer(spec, size, int(eot), hashlib.sha256(text.encode()).hexdigest(), text, hf)


def load_tokenizer_file(path: Path, spec: str | None = None) -> Tokenizer:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"tokenizer file {str(path)!r} cannot be read: {err}") from None
    return from_json(spec or str(path), text, f"tokenizer file {str(path)!r}")


def train_bpe(vocab_size: int, sample: Iterable[bytes]) -> Tokenizer:
    """A byte-level BPE (GPT-2's pre-tokenizer) trained on ``sample``; deterministic for a given sample."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BPE_EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator((p.decode("utf-8") for p in sample), trainer=trainer)
    learned = hf.get_vocab_size(with_added_tokens=True)
    if learned < vocab_size:
        print(
            f"attnres data: the sample gives only {learned:,} distinct tokens; the vocabulary stays {vocab_size:,} "
            "(the model's embedding keeps rows no token uses)",
            file=sys.stderr,
        )
    return from_json(f"bpe:{vocab_size}", hf.to_str(), f"bpe:{vocab_size}")


def vocab_size_of(spec: str) -> int:
    """The vocabulary a spec gives, without a corpus: what a run config's model.vocab_size must be."""
    kind, value = parse_spec(spec)
    if kind == "bytes":
        return 256
    if kind in ("bpe", "tokens"):
        return value
    return load_tokenizer_file(value).vocab_size
