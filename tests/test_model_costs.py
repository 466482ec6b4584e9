"""Each model's cost: ModelFlops.from_active_params (2 FLOPs per active parameter per token, MoE active
count, attention ignored), parsing --model-params, where a model's FLOP shape comes from, and per-sample
FLOPs with and without prompt token counts (the issue's gpt-oss-20b figure)."""

from dataclasses import replace

import numpy as np
import pytest

from isocompute.errors import InputError
from isocompute.flops import ModelFlops, attention_flops, decode_flops, forward_flops, prefill_flops
from isocompute.solver.models.costs import (
    parse_model_params,
    parse_param_count,
    resolve_model_flops,
    sample_flops,
)
from isocompute.solver.models.tables import join_tables
from isocompute.solver.outcomes import from_records
from isocompute.training.tiny import tiny_config


def test_from_active_params_is_two_flops_per_active_parameter_per_token():
    m = ModelFlops.from_active_params(3.6e9, total_params=21e9, name="gpt-oss-20b")
    assert (m.matmul_params, m.n_params, m.n_layers, m.d_attn, m.name) == (3_600_000_000, 21_000_000_000, 0, 0,
                                                                           "gpt-oss-20b")
    # the table: 1,735 generated tokens at 2 · 3.6e9 per token ≈ 1.2e13 (prefill yields token 1)
    assert decode_flops(m, 0, 1736) == 2 * 3.6e9 * 1735
    assert prefill_flops(m, 100) == 2 * 3.6e9 * 100
    assert forward_flops(m, 50, past=1000) == 2 * 3.6e9 * 50
    assert attention_flops(m, 50, past=10_000) == 0  # the ignored quadratic term
    assert ModelFlops.from_active_params(14e9).n_params == 14_000_000_000


@pytest.mark.parametrize(("args", "kwargs"), [((0,), {}), ((-1e9,), {}), ((float("nan"),), {}),
                                               ((3.6e9,), {"total_params": 1e9})])
def test_from_active_params_errors(args, kwargs):
    with pytest.raises(InputError, match="active parameters must be a positive number"):
        ModelFlops.from_active_params(*args, **kwargs)


def test_parse_model_params():
    assert parse_model_params(["gpt-oss-20b=3.6e9", "Phi-4-reasoning=14B", "q=800m"]) == {
        "gpt-oss-20b": 3.6e9, "Phi-4-reasoning": 14e9, "q": 8e8}
    assert parse_param_count(" 14.8B ") == pytest.approx(14.8e9)
    for bad, match in [(["x"], "NAME=ACTIVE_PARAMS"), (["a=1", "a=2"], "twice"), (["a=lots"], "bad parameter count"),
                       (["a=0"], "bad parameter count"), (["a b=1"], "bad model name")]:
        with pytest.raises(InputError, match=match):
            parse_model_params(bad)


def _table(prompt_tokens=None, meta=None, tokens=(3, 5)):
    rec = {"id": "p1", "prompt": "2+2?", "gold": "4",
           "samples": [{"answer": "4", "correct": True, "completion_tokens": t} for t in tokens],
           "meta": {"task": "arith", **(meta or {})}}
    if prompt_tokens is not None:
        rec["prompt_tokens"] = prompt_tokens
    return from_records([rec])


def test_resolve_model_flops_sources_and_errors():
    cfg = tiny_config().to_dict()
    mt = join_tables({"a": _table(meta={"model_config": cfg}), "b": _table(), "c": _table()})
    got = resolve_model_flops(mt, params={"b": 1e6}, configs={"c": cfg})
    assert replace(got["a"], name="c") == got["c"] and got["c"].name == "c" and got["b"].matmul_params == 1_000_000
    with pytest.raises(InputError, match="model b has no cost.*--model-params b=ACTIVE_PARAMS"):
        resolve_model_flops(mt, configs={"c": cfg})
    with pytest.raises(InputError, match="both an active parameter count and a config"):
        resolve_model_flops(mt, params={"b": 1e6, "c": 1e6}, configs={"c": cfg})
    with pytest.raises(InputError, match=r"not among the joined models"):
        resolve_model_flops(mt, params={"b": 1e6, "zz": 1.0}, configs={"c": cfg})


def test_sample_flops_with_and_without_prompt_tokens():
    model = ModelFlops.from_config(tiny_config())
    known = sample_flops(_table(prompt_tokens=7), model)
    assert not known.completion_only
    np.testing.assert_allclose(known.decode[0], [decode_flops(model, 7, 3), decode_flops(model, 7, 5)])
    np.testing.assert_allclose(known.prefill, [prefill_flops(model, 7)])
    unknown = sample_flops(_table(), model)
    assert unknown.completion_only and unknown.prefill.tolist() == [0.0]
    np.testing.assert_allclose(unknown.decode[0], [decode_flops(model, 0, 4), decode_flops(model, 0, 6)])
    active = sample_flops(_table(), ModelFlops.from_active_params(1e9))
    np.testing.assert_allclose(active.decode[0], [2e9 * 3, 2e9 * 5])
    ragged = from_records([{"id": "p1", "prompt": "x", "gold": "1", "samples": [
        {"answer": "1", "correct": True, "completion_tokens": 2}]},
        {"id": "p2", "prompt": "y", "gold": "1", "samples": [{"answer": "1", "correct": True}] * 2}])
    with pytest.raises(InputError, match="'p2' has samples without completion_tokens"):
        sample_flops(ragged, model)
