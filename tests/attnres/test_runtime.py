"""Where and how a run computes: the precision it resolves to, torch.compile's eager fallback, the CPU-only suite."""

from __future__ import annotations

import logging
import os
import warnings

import pytest
import torch

from attnres.config import ConfigError, resolve_run_config
from attnres.runtime import _COMPILE_LOGGER, _FirstCompileFailure, eager_fallback, resolve_precision
from tests.conftest import TINY


@pytest.mark.parametrize(
    "precision, gpu, bf16, expected, warns",
    [
        ("auto", False, None, "32-true", False),
        ("auto", True, True, "bf16-mixed", False),
        ("auto", True, False, "32-true", True),  # a V100 or T4: fp32, said once
        ("32-true", True, False, "32-true", False),
        ("bf16-mixed", True, True, "bf16-mixed", False),
        ("bf16-mixed", False, None, "bf16-mixed", False),  # CPU autocast has bf16
    ],
)
def test_precision_resolves_by_what_the_device_supports(precision, gpu, bf16, expected, warns):
    resolved, warning = resolve_precision(precision, gpu, bf16)
    assert resolved == expected and (warning is not None) == warns


def test_bf16_on_a_gpu_without_it_is_one_clear_error():
    with pytest.raises(ConfigError, match="does not support bf16.*runtime.precision=32-true"):
        resolve_precision("bf16-mixed", True, bf16_supported=False)


@pytest.fixture
def fallback():
    """eager_fallback for one test, with torch's compile caches reset before and after it."""
    torch._dynamo.reset()
    with eager_fallback():
        yield
    torch._dynamo.reset()


def test_a_sublayer_that_fails_to_compile_runs_eagerly_with_one_warning(fallback):
    from attnres import AttnResLM

    cfg = resolve_run_config(None, TINY + ["model.residual=block", "model.n_blocks=2"]).model
    torch.manual_seed(0)
    model = AttnResLM(cfg)
    tokens = torch.randint(0, 256, (2, 16))
    expected = model(tokens)

    def broken_backend(graph, example_inputs):
        raise RuntimeError("no C++ compiler on this node (simulated)")

    for sublayer in model.sublayers:  # as runtime.compile does, with a backend that cannot compile
        sublayer.compile(backend=broken_backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [model(tokens) for _ in range(2)]
    failures = [w for w in caught if "torch.compile failed" in str(w.message)]
    assert len(failures) == 1 and "runtime.compile=false" in str(failures[0].message), [str(w.message) for w in caught]
    for out in got:
        torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_the_eager_fallback_is_undone_when_its_block_ends():
    """A compiled run used to leave torch's suppress_errors on and its log filter in place for the whole process, so a
    compile of the caller's own that failed later was hidden and its warning swallowed."""
    logger = logging.getLogger(_COMPILE_LOGGER)
    before, filters = torch._dynamo.config.suppress_errors, list(logger.filters)
    with eager_fallback():
        assert torch._dynamo.config.suppress_errors
        assert any(isinstance(f, _FirstCompileFailure) for f in logger.filters)
    assert torch._dynamo.config.suppress_errors == before and logger.filters == filters
    with pytest.raises(RuntimeError, match="simulated"), eager_fallback():  # and when the block raises
        raise RuntimeError("simulated")
    assert torch._dynamo.config.suppress_errors == before and logger.filters == filters


def test_the_filter_passes_what_is_not_a_failure():
    record = logging.LogRecord(_COMPILE_LOGGER, logging.INFO, __file__, 1, "recompiling", None, None)
    assert _FirstCompileFailure().filter(record)


def test_the_default_suite_runs_on_cpu_whatever_gpus_are_visible(request):
    """tests/conftest.py hides every GPU unless `-m gpu` selects the GPU tests: a CPU test must train on CPU."""
    if "gpu" in request.config.getoption("markexpr").replace("not gpu", ""):
        pytest.skip("the GPU tests were selected: GPUs stay visible")
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == "" and not torch.cuda.is_available()
