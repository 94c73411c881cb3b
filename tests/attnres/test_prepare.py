"""``attnres data prepare``: sources of every format, BPE tokens equal to one-go tokenization, resume after kill -9,
exactly-once under concurrency, and one clear error for every kind of bad input."""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from attnres.config import DataConfig
from attnres.data.corpus import load_corpus
from attnres.data.errors import DataError
from attnres.data.prepare import MANIFEST, PrepareSpec, prepare, unit_tokens_in_order
from attnres.data.tokenizer import load_tokenizer_file
from tests.cli_helpers import attnres

WORDS = "the of and to in a is that for it as was with be by on not he I this are or his from at which".split()


def write_text(path: Path, n_words: int, seed: int) -> str:
    """Generated prose: lines of random words, so BPE has something to merge and the chunker line breaks."""
    rng = np.random.default_rng(seed)
    words = rng.choice(WORDS, size=n_words)
    lines = [" ".join(words[i : i + 12]) for i in range(0, n_words, 12)]
    text = "\n".join(lines) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return text


def corpus_folder(root: Path, n_files: int = 6, n_words: int = 20_000) -> Path:
    for i in range(n_files):
        write_text(root / f"doc{i:02d}.txt", n_words, seed=i)
    return root


def run_prepare(*args: str, **kwargs) -> subprocess.Popen:
    """``attnres data prepare ARGS`` started in a fresh process: to kill it, and for two at once (the other tests run
    the command in-process, tests.cli_helpers.attnres)."""
    return subprocess.Popen(
        [sys.executable, "-m", "attnres.cli", "data", "prepare", *args, "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        **kwargs,
    )


def data_files(folder: Path) -> dict[str, bytes]:
    """Everything a run reads from a prepared folder (the unit records are bookkeeping: they name their writer)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and not p.name.startswith(".")}


def test_every_source_format_gives_its_text_and_one_end_of_text_per_document(tmp_path):
    src = tmp_path / "src"
    plain = write_text(src / "a.txt", 3000, 1)
    zipped = write_text(src / "b.txt.gz", 3000, 2)
    docs = ["first document", "second one, longer " * 50, "third"]
    (src / "c.jsonl").write_text("\n".join(json.dumps({"text": d, "id": i}) for i, d in enumerate(docs)) + "\n")
    with gzip.open(src / "d.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": "gzipped json"}) + "\n\n")  # a blank line is skipped
    pq.write_table(pa.table({"text": ["row one", "row two"], "n": [1, 2]}), src / "e.parquet")
    (src / "notes.md").write_text("not a source format: ignored")
    corpus = load_corpus(DataConfig(corpus=str(src), chunk_bytes=1024, val_fraction=0.1))
    texts = [plain, zipped, *docs, "gzipped json", "row one", "row two"]
    assert len(corpus.train) + len(corpus.val) == sum(len(t.encode()) for t in texts) + len(texts)
    assert sorted(Path(f).name for f in corpus.files) == ["a.txt", "b.txt.gz", "c.jsonl", "d.jsonl.gz", "e.parquet"]
    tokens = np.concatenate([np.asarray(corpus.train), np.asarray(corpus.val)])
    assert (tokens == 0).sum() == len(texts)  # byte 0 is the end-of-text token


def test_bpe_tokens_equal_one_go_tokenization_and_workers_change_nothing(tmp_path):
    src = corpus_folder(tmp_path / "src", n_files=4, n_words=15_000)
    biggest = max(p.stat().st_size for p in src.iterdir())  # one unit per file: not cut, not grouped
    spec = PrepareSpec(str(src), "bpe:600", chunk_bytes=2048, unit_bytes=biggest, sample_bytes=200_000)
    one = prepare(spec, tmp_path / "one", workers=1, progress=False)
    two = prepare(spec, tmp_path / "two", workers=2, progress=False)
    assert data_files(one) == data_files(two)  # byte-identical, tokenizer included
    manifest = json.loads((one / MANIFEST).read_text())
    assert manifest["vocab_size"] == 600 and manifest["dtype"] == "uint16"
    tokenizer = load_tokenizer_file(one / "tokenizer.json")
    for unit, path in enumerate(sorted(src.iterdir())):
        whole = tokenizer.encode_text(path.read_text()).tolist() + [tokenizer.eot_id]
        assert unit_tokens_in_order(one, unit).tolist() == whole
    bpt = manifest["splits"]["val"]["bytes"] / manifest["splits"]["val"]["tokens"]
    assert 1.5 < bpt < 6  # BPE merges: several bytes per token


@pytest.mark.integration  # kill and resume: pytest -m integration
def test_kill_9_mid_preparation_then_the_same_command_resumes_to_identical_output(tmp_path):
    src = corpus_folder(tmp_path / "src", n_files=40, n_words=6_000)
    args = (str(src), "--tokenizer", "bpe:500", "--unit-mib", "0.03", "--sample-mib", "0.2")  # a unit per file
    reference = run_prepare(*args, "--out", str(tmp_path / "ref"))
    assert reference.wait(timeout=300) == 0, reference.stderr.read()
    out = tmp_path / "out"
    victim = run_prepare(*args, "--out", str(out))
    deadline = time.monotonic() + 120
    while not (out / "units" / "00003.json").exists():  # a few units done, most not
        assert victim.poll() is None and time.monotonic() < deadline, "the preparation ended before the kill"
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert not (out / MANIFEST).exists()
    records = sorted((out / "units").glob("*.json"))
    stamps = {p.name: p.stat().st_mtime_ns for p in records}
    again = run_prepare(*args, "--out", str(out))
    assert again.wait(timeout=300) == 0, again.stderr.read()
    assert f"{len(records)} unit(s) already prepared" in again.stderr.read()
    assert {p.name: p.stat().st_mtime_ns for p in records} == stamps  # finished units were not redone
    assert data_files(out) == data_files(tmp_path / "ref")
    assert not [p for p in out.rglob("*.tmp")]  # nothing half-written left behind


def test_two_preparations_started_together_build_it_once(tmp_path):
    src = corpus_folder(tmp_path / "src", n_files=30, n_words=20_000)
    out = tmp_path / "out"
    args = (str(src), "--tokenizer", "bpe:400", "--unit-mib", "0.1", "--out", str(out))
    first = run_prepare(*args)
    while not (out / "prepare.json").exists():  # the first holds the lock
        assert first.poll() is None
        time.sleep(0.01)
    # Pause the first mid-build until the second says it waits: on a slow machine the first could otherwise finish
    # before the second has even imported, and the second would find the work done without ever waiting.
    first.send_signal(signal.SIGSTOP)
    try:
        assert first.poll() is None and not (out / MANIFEST).exists()
        second = run_prepare(*args)
        said: list[str] = []
        reader = threading.Thread(target=lambda: said.extend(line for line in second.stderr), daemon=True)
        reader.start()
        deadline = time.monotonic() + 120
        while not any("waiting for" in line for line in said):
            assert second.poll() is None and time.monotonic() < deadline, said
            time.sleep(0.01)
    finally:
        first.send_signal(signal.SIGCONT)
    results = [(first.wait(timeout=300), first.stderr.read()), (second.wait(timeout=300), "")]
    reader.join(timeout=60)  # the rest of the second's stderr
    results[1] = (results[1][0], "".join(said))
    assert [rc for rc, _ in results] == [0, 0], results
    assert "waiting for" not in results[0][1]
    assert "being prepared by pid" in results[1][1]
    writers = {json.loads(p.read_text())["written_by"] for p in (tmp_path / "out" / "units").glob("*.json")}
    assert len(writers) == 1  # every unit (and so every shard) written by one of them, once


@pytest.fixture
def prepared(tmp_path) -> Path:
    src = corpus_folder(tmp_path / "src", n_files=3, n_words=4_000)
    return prepare(PrepareSpec(str(src), "bytes", chunk_bytes=1024, unit_bytes=64), tmp_path / "prep", progress=False)


def test_a_damaged_prepared_folder_is_named_and_rebuilt_by_running_prepare_again(prepared):
    cfg = DataConfig(corpus=str(prepared))
    assert len(load_corpus(cfg).train) > 0
    shard = prepared / "train-00001.bin"
    original = shard.read_bytes()
    shard.write_bytes(original[:-7])
    with pytest.raises(DataError, match=r"train-00001.bin is truncated.*attnres data prepare"):
        load_corpus(cfg)
    shard.unlink()
    with pytest.raises(DataError, match=r"train-00001.bin is missing"):
        load_corpus(cfg)
    other = prepared / "val-00000.bin"
    data = bytearray(other.read_bytes())
    data[24:32] = b"f" * 8  # another tokenizer's hash in the header
    other.write_bytes(bytes(data))
    shard.write_bytes(original)
    with pytest.raises(DataError, match=r"val-00000.bin was written by another tokenizer"):
        load_corpus(cfg)
    spec = json.loads((prepared / "prepare.json").read_text())["spec"]
    prepare(PrepareSpec(**spec), prepared, progress=False)  # what the message says to do: run prepare again
    assert other.read_bytes()[24:32] != b"f" * 8
    assert len(load_corpus(cfg).val) > 0


@pytest.mark.parametrize(
    "setup, fragments",
    [
        (None, ["tokenizer 'bpe:12'", "bpe:8192"]),
        (lambda d: (d / "a.txt").write_bytes(b"caf\xe9 au lait\n"), ["a.txt", "not UTF-8", "offset 3"]),
        (lambda d: (d / "a.txt").write_bytes(b"text\x00\x01\x02"), ["a.txt", "NUL", "binary"]),
        (lambda d: (d / "a.jsonl").write_text('{"text": "ok"}\n{"body": "no"}\n'), ["a.jsonl, line 2", "'body'"]),
        (lambda d: (d / "a.jsonl").write_text('{"text": "ok"}\nnot json\n'), ["a.jsonl, line 2", "JSON"]),
        (lambda d: pq.write_table(pa.table({"body": ["x"]}), d / "a.parquet"), ["a.parquet", "'body'", "--text-field"]),
        (lambda d: (d / "a.txt").write_text(""), ["holds no text"]),
        (lambda d: (d / "a.md").write_text("x"), ["no .txt"]),
    ],
)
def test_bad_input_gets_one_clear_error_and_leaves_nothing_half_written(tmp_path, setup, fragments):
    src = tmp_path / "src"
    src.mkdir()
    if setup is None:  # a good source, a bad tokenizer spec
        write_text(src / "ok.txt", 100, 0)
    else:
        setup(src)
    tokenizer = "bytes" if setup else "bpe:12"
    out = tmp_path / "out"
    result = attnres("data", "prepare", src, "--tokenizer", tokenizer, "--out", out, "--no-progress")
    assert result.returncode == 2, result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("attnres data: error:")
    for fragment in fragments:
        assert fragment in message
    assert not (out / MANIFEST).exists() and not list(out.glob("*.bin")) and not list(out.rglob("*.tmp"))


def test_a_tokenizer_json_that_does_not_parse_or_lacks_an_end_of_text_token(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"version": "1.0", "model": ')
    with pytest.raises(DataError, match="not a tokenizer.json"):
        load_tokenizer_file(bad)
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(bad))
    with pytest.raises(DataError, match="no end-of-text token"):
        load_tokenizer_file(bad)


def test_a_run_config_whose_vocabulary_disagrees_with_the_data_is_refused(prepared):
    from attnres.config import resolve_run_config
    from attnres.data.corpus import with_data_vocab

    cfg = with_data_vocab(resolve_run_config(None, ["data.tokenizer=bpe:4096"]))
    assert cfg.model.vocab_size == 4096  # the default takes the data's vocabulary
    with pytest.raises(DataError, match=r"model.vocab_size=1000.*4,096"):
        with_data_vocab(resolve_run_config(None, ["data.tokenizer=bpe:4096", "model.vocab_size=1000"]))
    with pytest.raises(DataError, match=r"data.tokenizer='bpe:4096', but .* was prepared with 'bytes'"):
        load_corpus(DataConfig(corpus=str(prepared), tokenizer="bpe:4096"))


def test_existing_token_files_are_accepted_as_they_are(tmp_path):
    src = tmp_path / "tokens"
    src.mkdir()
    ids = np.random.default_rng(0).integers(0, 50_000, 300_000)
    ids.astype(np.uint16).tofile(src / "train.bin")  # nanoGPT style
    np.save(src / "more.npy", ids[:100_000].astype(np.uint32))  # OLMo style
    out = prepare(PrepareSpec(str(src), "tokens:50304", chunk_bytes=1024), tmp_path / "prep", progress=False)
    corpus = load_corpus(DataConfig(corpus=str(out)))
    assert corpus.vocab_size == 50304 and np.isnan(corpus.val_bytes_per_token)  # no text behind them: no bpb
    merged = np.concatenate([np.asarray(corpus.train), np.asarray(corpus.val)])
    assert sorted(merged.tolist()) == sorted(ids.tolist() + ids[:100_000].tolist())
    with pytest.raises(DataError, match=r"more.npy: token id .* outside the vocabulary of 1,000.*tokens:<vocab>"):
        prepare(PrepareSpec(str(src), "tokens:1000"), tmp_path / "small", progress=False)
    with pytest.raises(DataError, match=r"take the tokenizer tokens:<vocab>"):
        prepare(PrepareSpec(str(src), "bytes"), tmp_path / "bytes", progress=False)
