"""``attnres generate``: text from a trained run's checkpoint and tokenizer, and one clear line for each thing that
can be wrong with its input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from attnres.cli import main
from attnres.config import ConfigError, resolve_run_config
from attnres.decoding import generate, load_trained, run_tokenizer
from attnres.storage import schema
from attnres.training.run import train
from tests.conftest import TINY


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A tiny Block AttnRes run on the built-in corpus (bytes), its checkpoint kept."""
    folder = tmp_path_factory.mktemp("generate") / "run"
    overrides = TINY + ["train.tokens=20000", "train.eval_tokens=4096", "model.residual=block", "model.n_blocks=3"]
    result = train(resolve_run_config(None, overrides), folder, progress=False)
    assert result.status == "done"
    return folder


def test_generate_continues_the_prompt_and_a_seed_repeats_it(run_dir, capsys):
    args = [str(run_dir), "--prompt", "And the", "--max-new-tokens", "30", "--samples", "2", "--seed", "7"]
    assert main(["generate", *args]) == 0
    first = capsys.readouterr()
    samples = first.out.split("--- sample ")[1:]
    assert len(samples) == 2 and all(s.split("\n", 1)[1].startswith("And the") for s in samples)
    assert "block" in first.err and "step" in first.err
    assert main(["generate", *args]) == 0
    assert capsys.readouterr().out == first.out
    assert main(["generate", str(run_dir / "checkpoints" / "last.ckpt"), *args[1:]]) == 0  # a .ckpt file as well
    assert capsys.readouterr().out == first.out


def test_greedy_generation_is_the_argmax_of_full_forwards(run_dir):
    """The cached decode picks what re-running the whole sequence without a cache would pick, token by token."""
    trained = load_trained(run_dir)
    prompt = torch.tensor([list(b"ROMEO: "), list(b"Thou sh")])
    new = generate(trained.model, prompt, 20, temperature=0.0)
    sequence = prompt
    with torch.no_grad():
        for _ in range(20):
            sequence = torch.cat([sequence, trained.model(sequence)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(new, sequence[:, prompt.shape[1] :])


def test_top_k_one_is_greedy_and_a_stop_token_ends_a_row(run_dir):
    trained = load_trained(run_dir)
    prompt = torch.tensor([list(b"the ")])
    greedy = generate(trained.model, prompt, 12, temperature=0.0)
    gen = torch.Generator().manual_seed(3)
    assert torch.equal(generate(trained.model, prompt, 12, temperature=1.5, top_k=1, generator=gen), greedy)
    stop = int(greedy[0, 4])
    stopped = generate(trained.model, prompt, 12, temperature=0.0, stop=stop)
    cut = greedy[0].tolist().index(stop) + 1
    assert stopped[0].tolist() == greedy[0, :cut].tolist()


def _error_of(capsys, *args: str) -> str:
    assert main(["generate", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_each_bad_input_gets_one_line(run_dir, tmp_path, capsys):
    assert "does not exist" in _error_of(capsys, str(tmp_path / "nowhere"))
    assert "not a run folder" in _error_of(capsys, str(tmp_path))

    bare = tmp_path / "bare"
    shutil.copytree(run_dir, bare, ignore=shutil.ignore_patterns("checkpoints"))
    assert "has no checkpoint" in _error_of(capsys, str(bare))

    assert "at most 63 tokens" in _error_of(capsys, str(run_dir), "--prompt", "x" * 64)  # seq_len 64
    assert "--temperature" in _error_of(capsys, str(run_dir), "--temperature", "-1")
    assert "--max-new-tokens" in _error_of(capsys, str(run_dir), "--max-new-tokens", "0")

    other = tmp_path / "other"
    shutil.copytree(run_dir, other)
    table = pq.read_table(other / schema.RUN_FILE)
    metadata = {**table.schema.metadata, b"schema_version": b"99"}
    pq.write_table(table.replace_schema_metadata(metadata), other / schema.RUN_FILE)
    assert "99" in _error_of(capsys, str(other))

    cut = tmp_path / "cut"
    shutil.copytree(run_dir, cut)
    ckpt = cut / "checkpoints" / "last.ckpt"
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    assert "cannot be used" in _error_of(capsys, str(cut))


def test_generation_past_the_context_stops_at_its_end_and_says_so(run_dir, capsys):
    assert main(["generate", str(run_dir), "--prompt", "a" * 60, "--max-new-tokens", "50", "--temperature", "0"]) == 0
    out = capsys.readouterr()
    assert "seq_len=64" in out.err and len(out.out.rstrip("\n").encode()) <= 64
    with pytest.raises(ConfigError, match="at most 4 new tokens"):
        generate(load_trained(run_dir).model, torch.zeros(1, 60, dtype=torch.long), 5)


def test_a_bpe_runs_tokenizer_is_read_from_its_data_folder(tmp_path):
    from attnres.data.tokenizer import train_bpe

    text = "the quick brown fox jumps over the lazy dog. " * 50
    tokenizer = train_bpe(300, [text.encode()])
    (tmp_path / "tokenizer.json").write_text(tokenizer.json)
    data = {"folder": str(tmp_path), "tokenizer": {"spec": "bpe:300", "hash": tokenizer.hash, "file": "tokenizer.json"}}
    (tmp_path / "data.json").write_text(json.dumps(data))
    loaded = run_tokenizer(tmp_path)
    ids = loaded.encode_text("the lazy fox")
    assert len(ids) < len("the lazy fox") and loaded.decode(ids) == "the lazy fox"

    data["tokenizer"]["hash"] = "0" * 64
    (tmp_path / "data.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="not the tokenizer the run trained with"):
        run_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(ConfigError, match="is missing"):
        run_tokenizer(tmp_path)
