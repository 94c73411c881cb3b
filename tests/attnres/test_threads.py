"""A run's numbers do not depend on the torch threads it was given (docs/training.md, "Threads and numerics"):
MKL's strict mode (attnres.blas), the native kernels' sums over tokens in token order, thread-independent
diagnostics; and what a run records of them."""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from attnres import AttnResLM, ModelConfig, blas
from attnres.config import resolve_run_config
from attnres.kernels import cpu as cpu_kernels
from attnres.mixers import Recorder
from attnres.runtime import cpu_cores, torch_threads
from attnres.storage import schema
from attnres.training.run import train
from tests.conftest import TINY

MKL = torch.backends.mkl.is_available()
needs_mkl = pytest.mark.skipif(not MKL, reason="torch is built without MKL: its BLAS has no strict mode to test")


@contextmanager
def threads(n: int):
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def at_threads(fn, counts=(1, 2)):
    out = []
    for n in counts:
        with threads(n):
            out.append(fn())
    return out


@needs_mkl
def test_this_process_runs_mkl_in_strict_mode():
    """Importing attnres asked for it before the first matrix product (tests/conftest.py imports attnres first)."""
    assert blas.is_strict(blas.in_effect()), blas.in_effect()


@needs_mkl
@pytest.mark.parametrize("residual", ["baseline", "full", "block"])
def test_one_training_step_gives_the_same_bits_at_1_and_2_threads(residual):
    """16 x 128 tokens: MKL splits the weight gradients' token sums over 2 threads in its default mode (17 of 29
    gradients differed), and the merge kernel split the depth queries' gradient (pseudo_query differed in strict)."""
    cfg = ModelConfig(residual=residual, n_layer=4, d_model=48, n_head=3, seq_len=128, vocab_size=256)
    batch = torch.randint(0, 256, (16, 129), generator=torch.Generator().manual_seed(0))

    def step():
        torch.manual_seed(0)
        model = AttnResLM(cfg)
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in model.named_parameters()}

    (loss1, grads1), (loss2, grads2) = at_threads(step)
    assert torch.equal(loss1, loss2)
    assert [n for n in grads1 if not torch.equal(grads1[n], grads2[n])] == []


@pytest.mark.skipif(not cpu_kernels.usable(torch.zeros(1)), reason="the native CPU kernels did not build here")
def test_the_merge_kernels_query_gradient_is_the_same_bits_at_1_and_2_threads():
    """du, the gradient of a merge's query, sums over every token: summed in per-thread parts, it differed."""
    gen = torch.Generator().manual_seed(0)
    n, d, k = 4096, 48, 3

    def rand(*shape):
        return torch.randn(*shape, generator=gen)

    dh, p, later, u = rand(n, d), rand(n, d), rand(n, d), rand(d)
    weights = torch.softmax(rand(k, n), 0)
    values, r, logit, keep = rand(k, n, d), rand(n).abs() + 0.5, rand(n), torch.sigmoid(rand(n))

    def backward():
        value_grad, logit_grad = torch.zeros(k, n, d), torch.zeros(k, n)
        dp, du = cpu_kernels.ops().merge_backward(
            dh, p, later, u, weights, values, value_grad, r, logit, keep, logit_grad
        )
        return dp, du, value_grad, logit_grad

    one, two = at_threads(backward)
    assert all(torch.equal(a, b) for a, b in zip(one, two))
    # and it is still the gradient: du = sum_t a_t p_t, a_t = -dscore_t r_t (attnres.kernels.two_phase.Merge)
    dh64, p64, v64, w64 = dh.double(), p.double(), values.double(), weights.double()
    dot_out = (w64 * (v64 * dh64).sum(-1)).sum(0)
    dscore = (dot_out - (dh64 * p64).sum(-1)) * keep.double() * (1 - keep.double())
    expected = (-dscore * r.double()) @ p64
    torch.testing.assert_close(one[1].double(), expected, rtol=1e-4, atol=1e-3)


@pytest.mark.skipif(not cpu_kernels.usable(torch.zeros(1)), reason="the native CPU kernels did not build here")
def test_the_norm_kernels_weight_gradient_is_the_same_bits_at_1_and_2_threads():
    """RMSNorm's weight gradient sums over every token too (attnres.kernels.rms_norm)."""
    gen = torch.Generator().manual_seed(0)
    n, d = 4096, 48
    g, x, w = torch.randn(n, d, generator=gen), torch.randn(n, d, generator=gen), torch.randn(d, generator=gen)
    r = x.square().mean(-1).add(1e-6).rsqrt()
    one, two = at_threads(lambda: cpu_kernels.ops().rms_norm_backward(g, x, r, w))
    assert all(torch.equal(a, b) for a, b in zip(one, two))
    expected = (g.double() * x.double() * r.double()[:, None]).sum(0)  # fp32 sums of 4,096 terms: to 1e-4
    torch.testing.assert_close(one[1].double(), expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("numel", [40_000, 100_000, 1_000_003])
def test_diagnostic_norms_are_the_same_bits_at_1_and_2_threads(numel):
    """torch's sum of a whole tensor of more than 32,768 elements is formed in per-thread parts; the diagnostics'
    RMS and gradient norms (layers.parquet) used it, and differed between 1 and 2 threads at a d_model 192 run."""
    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel))
    one, two = at_threads(lambda: Recorder.rms(x))
    assert one == two
    assert one == pytest.approx(float(x.double().square().mean().sqrt()), rel=1e-12)


@needs_mkl
@pytest.mark.skipif(cpu_cores() < 2, reason="2 threads need 2 cores here: runtime.threads is capped at the cores")
def test_a_tiny_run_trains_to_the_same_losses_at_1_and_2_threads(tmp_path):
    """The whole run: every logged loss, gradient norm, diagnostic and depth weight, bit for bit; and run.parquet
    says what each ran with."""
    runs = {}
    for n in (1, 2):
        with threads(torch.get_num_threads()):  # train() sets the process's threads; put them back after
            overrides = [o for o in TINY if not o.startswith("runtime.threads")] + [f"runtime.threads={n}"]
            result = train(resolve_run_config(None, overrides), tmp_path / f"threads{n}", progress=False)
        assert result.status == "done"
        runs[n] = tmp_path / f"threads{n}"
    for name in (schema.METRICS_FILE, schema.LAYERS_FILE, schema.DEPTH_ATTN_FILE):
        one, two = (pq.read_table(runs[n] / name).to_pandas() for n in (1, 2))
        timing = [c for c in one.columns if c in ("tokens_per_s", "wall_s")]
        one, two = one.drop(columns=timing), two.drop(columns=timing)
        assert len(one) > 0
        pd.testing.assert_frame_equal(one, two, check_exact=True, obj=name)
    rows = {n: schema.read_run_row(runs[n]) for n in (1, 2)}
    assert rows[1]["val_loss"] == rows[2]["val_loss"] and rows[1]["train_loss"] == rows[2]["train_loss"]
    assert (rows[1]["threads"], rows[2]["threads"]) == (1, 2)
    assert rows[1]["blas"] == rows[2]["blas"] == blas.in_effect() == "AUTO,STRICT"


def run_python(code: str, **env: str) -> str:
    """``code`` in a fresh interpreter (MKL's mode is fixed once per process), with ``env`` added; its stdout."""
    import os

    environ = {k: v for k, v in os.environ.items() if k != blas.VARIABLE} | env
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@needs_mkl
def test_strict_mode_holds_when_torch_was_imported_before_attnres():
    """What matters is MKL's first call, not torch's import: a caller may import torch first."""
    code = "import torch; import attnres; from attnres import blas; print(blas.in_effect())"
    assert run_python(code) == "AUTO,STRICT"


@needs_mkl
def test_a_matrix_product_before_attnres_leaves_mkl_in_its_default_mode_and_a_run_says_so():
    code = (
        "import torch; torch.ones(4, 4) @ torch.ones(4, 4); import attnres; from attnres import blas; "
        "mode = blas.in_effect(); print(mode); print(blas.problem(mode, 2))"
    )
    mode, warning = run_python(code).splitlines()
    assert mode == "off"
    assert "MKL had run before attnres was imported" in warning and "thread count (2)" in warning


@needs_mkl
@pytest.mark.parametrize(
    ("value", "mode"), [("", "off"), ("COMPATIBLE", "COMPATIBLE"), ("COMPATIBLE,STRICT", "COMPATIBLE,STRICT")]
)
def test_the_users_mkl_cbwr_wins(value, mode):
    """COMPATIBLE: the one branch MKL runs as asked on any x86 CPU (on an AMD CPU it runs AVX2 and the other
    Intel-specific branches as AUTO, so a test that asked for AVX2 failed there)."""
    code = "import attnres; from attnres import blas; m = blas.in_effect(); print(m); print(blas.problem(m, 1))"
    got, warning = run_python(code, MKL_CBWR=value).splitlines()
    assert got == mode
    if blas.is_strict(mode):
        assert warning == "None"
    else:
        assert f"MKL_CBWR={value!r} in the environment" in warning


def test_no_warning_where_there_is_no_mkl_mode_to_read():
    assert blas.problem("no MKL", 2) is None and blas.problem("MKL (mode unknown)", 2) is None
    assert blas.problem("AUTO,STRICT", 2) is None and blas.problem("off", 2) is not None


def test_more_threads_than_cores_are_capped_with_one_line(tmp_path, capsys):
    """runtime.threads=1000 on 2 cores was taken as it stood: 1000 OpenMP threads spinning on 2 cores. Capped at the
    cores with one warning (the numbers do not depend on the threads), and run.parquet records the cap."""
    from attnres.cli import main

    assert torch_threads(1000, cores=2) == (2, torch_threads(1000, cores=2)[1])
    assert "runtime.threads=1000 is more than the 2 core(s) this process may run on" in torch_threads(1000, 2)[1]
    assert torch_threads(2, cores=2) == (2, None) and torch_threads(0, cores=2) == (0, None)
    run = tmp_path / "run"
    tiny = [o for o in TINY if not o.startswith(("runtime.threads", "train.tokens"))]
    with threads(torch.get_num_threads()):  # train() sets the process's threads; put them back after
        code = main(["train", *tiny, "runtime.threads=1000", "train.tokens=1024", "--no-progress", "--out", str(run)])
    err = capsys.readouterr().err
    assert code == 0, err
    cores = cpu_cores()
    assert f"attnres train: warning: runtime.threads=1000 is more than the {cores} core(s)" in err, err
    assert f"training with {cores} thread(s)" in err and schema.read_run_row(run)["threads"] == cores
