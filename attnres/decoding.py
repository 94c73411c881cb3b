"""Text from a trained run: its model and tokenizer loaded from the run folder, a prompt prefilled into a KV cache,
then one token at a time (``attnres generate``; docs/method.md, "Decoding").

Every variant decodes the same way: the token attention keeps its keys and values in a
:class:`~attnres.model.KVCache`, and the depth mixing of a new token needs nothing from earlier tokens (each token
mixes its own embedding and sublayer outputs), so a decode step is the model's ordinary forward over the new token
with the cache passed in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from attnres.config import ConfigError, RunConfig, resolve_run_config
from attnres.data.tokenizer import Tokenizer, builtin_tokenizer, load_tokenizer_file
from attnres.model import AttnResLM, KVCache
from attnres.storage import schema
from attnres.training.checkpoints import LAST, checkpoint_problem


@dataclass
class Trained:
    """A run's model (eval mode, fp32) with the tokenizer its data was prepared with."""

    model: AttnResLM
    tokenizer: Tokenizer
    cfg: RunConfig
    checkpoint: Path
    step: int
    finished: bool


def _checkpoint_of(path: Path) -> tuple[Path, Path]:
    """(run folder, checkpoint) for a run folder (its ``checkpoints/last.ckpt``) or a ``.ckpt`` file inside one."""
    if not path.exists():
        raise ConfigError(f"{path} does not exist; give a run folder (RESULTS/<sweep>/<run_id>) or a .ckpt file in it")
    if path.is_file():
        run_dir = path.parent.parent if path.parent.name == schema.CHECKPOINT_DIR else path.parent
        return run_dir, path
    checkpoint = path / schema.CHECKPOINT_DIR / LAST
    if not checkpoint.is_file():
        if not (path / "config.yaml").is_file():
            raise ConfigError(f"{path} is not a run folder (it has no config.yaml); give RESULTS/<sweep>/<run_id>")
        raise ConfigError(
            f"{path} has no checkpoint ({schema.CHECKPOINT_DIR}/{LAST}): the run has not trained yet, or its "
            "checkpoints were not kept (a study's committed runs leave them out); train it, or give a .ckpt file"
        )
    return path, checkpoint


def _run_row(run_dir: Path) -> dict:
    """The run's run.parquet row ({} before it has one); a run written by another schema version is refused by name,
    before its checkpoint is read."""
    if not (run_dir / schema.RUN_FILE).is_file():
        return {}  # not finished yet: its config and checkpoint say all there is
    try:
        return schema.read_table(run_dir / schema.RUN_FILE).to_pylist()[0]
    except schema.SchemaError as err:
        raise ConfigError(f"{err}; generate with the attnres version that trained it") from None


def run_tokenizer(run_dir: Path) -> Tokenizer:
    """The tokenizer of the data the run trained on, from its ``data.json`` (bytes, a BPE, a tokenizer.json)."""
    try:
        data = json.loads((run_dir / "data.json").read_text())
        spec, file = data["tokenizer"]["spec"], data["tokenizer"].get("file")
    except (OSError, ValueError, KeyError, TypeError) as err:
        where = run_dir / "data.json"
        raise ConfigError(f"{where} cannot tell the run's tokenizer ({err}); is it a run folder?") from None
    tokenizer = None if spec.startswith("bpe:") or file else builtin_tokenizer(spec)
    if tokenizer is not None and tokenizer.eot_id < 0:
        raise ConfigError(f"the run trained on token ids ({spec}): it has no tokenizer to turn a prompt into tokens")
    if tokenizer is None:
        path = Path(data["folder"]) / file
        if not path.is_file():
            raise ConfigError(
                f"the run's tokenizer {path} is missing (data.json names it); prepare the run's data again "
                f"(attnres data prepare) or copy the tokenizer.json there"
            )
        tokenizer = load_tokenizer_file(path, spec)
        if tokenizer.hash != data["tokenizer"]["hash"]:
            raise ConfigError(f"{path} is not the tokenizer the run trained with (its hash differs from data.json's)")
    return tokenizer


def load_trained(path: str | Path, device: str | torch.device = "cpu") -> Trained:
    """The model and tokenizer of a run folder or of one of its checkpoints; one clear error for anything missing."""
    run_dir, checkpoint = _checkpoint_of(Path(path))
    row = _run_row(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{run_dir} has no config.yaml: the checkpoint {checkpoint} is not inside a run folder")
    cfg = resolve_run_config(run_dir / "config.yaml")
    tokenizer = run_tokenizer(run_dir)
    if why := checkpoint_problem(checkpoint):
        raise ConfigError(f"checkpoint {checkpoint} cannot be used: {why}")
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    weights = {k.removeprefix("model."): v for k, v in state["state_dict"].items() if k.startswith("model.")}
    model = AttnResLM(cfg.model)
    model.load_state_dict(weights)
    finished = row.get("status") == "done"
    model = model.to(device=device, dtype=torch.float32).eval()
    return Trained(model, tokenizer, cfg, checkpoint, int(state.get("global_step", 0)), finished)


def sample_next(logits: Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None) -> Tensor:
    """One token per row of ``logits`` (B, V): the most likely at temperature 0, else a draw from the softmax of
    logits / temperature, restricted to the ``top_k`` most likely when given."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator).squeeze(-1)


@torch.inference_mode()
def generate(
    model: AttnResLM,
    prompt: Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    stop: int | None = None,
) -> Tensor:
    """``prompt`` (B, T) continued by up to ``max_new_tokens`` tokens each, (B, <= max_new_tokens): the prompt
    prefilled into a KV cache in one forward, then one forward per new token. With ``stop`` a row ends at that token
    (kept); generation ends when every row has."""
    batch, length = prompt.shape
    capacity = length + max_new_tokens
    if capacity > model.cfg.seq_len:
        raise ConfigError(
            f"a prompt of {length} tokens and {max_new_tokens} new ones need a context of {capacity}; the model's is "
            f"seq_len={model.cfg.seq_len}: ask for at most {max(0, model.cfg.seq_len - length)} new tokens"
        )
    cache = KVCache(model.cfg, batch, capacity, prompt.device, next(model.parameters()).dtype)
    logits = model(prompt, cache=cache)[:, -1]
    done = torch.zeros(batch, dtype=torch.bool, device=prompt.device)
    out = []
    for i in range(max_new_tokens):
        token = sample_next(logits, temperature, top_k, generator)
        if stop is not None:
            token = torch.where(done, stop, token)  # a finished row repeats its stop token (cut off by the caller)
            done |= token == stop
        out.append(token)
        if i + 1 == max_new_tokens or bool(done.all()):
            break
        logits = model(token[:, None], cache=cache)[:, -1]
    return torch.stack(out, dim=1) if out else prompt.new_zeros(batch, 0)
