"""Logprobs on the transformers engine and through ``isocompute sample --logprobs`` on the tiny model: each
sample's ``logprob_mean`` and ``confidence_min_window`` against a greedy decode written out here, padding and
micro-batches, sampling left unchanged, and the table's fields and meta."""

from __future__ import annotations

import json

import numpy as np
import pytest

from isocompute.cli import main
from isocompute.errors import InputError
from isocompute.flops.logprobs import LOGPROB_COST_FACTOR
from isocompute.solver.outcomes import read_outcomes
from isocompute.stages.sample import SampleConfig
from isocompute.tasks.confidence import sample_confidence

PROMPTS = ["What is 12 + 30?\n", "7*6=\n", "1+1=\n"]  # different lengths: rows are left-padded together


def greedy_by_hand(engine, prompt, max_tokens, k, window):
    """Greedy decoding without generate(): full forward passes, argmax, log-softmax of the raw logits."""
    import torch

    ids = engine.tokenizer(prompt, return_tensors="pt")["input_ids"]
    sampled, tops = [], []
    with torch.inference_mode():
        for _ in range(max_tokens):
            logp = torch.log_softmax(engine.model(ids).logits[0, -1].double(), dim=-1)
            tok = int(logp.argmax())
            sampled.append(float(logp[tok]))
            tops.append(logp.topk(k).values.tolist())
            ids = torch.cat([ids, torch.tensor([[tok]])], dim=1)
            if tok in engine.eos_ids:
                break
    return len(sampled), sample_confidence(sampled, tops, k=k, window=window)


def test_greedy_confidence_matches_a_decode_by_hand(engine):
    out = engine.generate_sync(PROMPTS, 2, 12, 0.0, logprobs=5, confidence_window=4)
    for prompt, comps in zip(PROMPTS, out, strict=True):
        m, (lp, conf) = greedy_by_hand(engine, prompt, 12, 5, 4)
        for c in comps:
            assert c.completion_tokens == m
            assert c.logprob_mean == pytest.approx(lp, abs=1e-4)
            assert c.confidence_min_window == pytest.approx(conf, abs=1e-4)


def test_micro_batches_and_padding_do_not_change_the_figures(engine, tiny_dir):
    from isocompute.engines.transformers_engine import TransformersEngine

    one_row = TransformersEngine(tiny_dir, micro_batch=1, threads=1)
    a = engine.generate_sync(PROMPTS, 1, 10, 0.0, logprobs=3)
    b = one_row.generate_sync(PROMPTS, 1, 10, 0.0, logprobs=3)
    for x, y in zip(sum(a, []), sum(b, []), strict=True):
        assert x.text == y.text
        assert x.logprob_mean == pytest.approx(y.logprob_mean, abs=1e-4)
        assert x.confidence_min_window == pytest.approx(y.confidence_min_window, abs=1e-4)


def test_asking_for_logprobs_leaves_sampling_alone(engine):
    plain = engine.generate_sync(PROMPTS, 4, 10, 1.0, seed=3)
    asked = engine.generate_sync(PROMPTS, 4, 10, 1.0, seed=3, logprobs=5)
    assert [[(c.text, c.completion_tokens) for c in o] for o in plain] == \
        [[(c.text, c.completion_tokens) for c in o] for o in asked]
    assert all(c.logprob_mean is None for o in plain for c in o)
    assert all(c.logprob_mean <= 0 and c.confidence_min_window >= 0 for o in asked for c in o)
    with pytest.raises(InputError, match="logprobs <= 20"):
        engine.generate_sync(PROMPTS, 1, 4, 1.0, logprobs=21)


def test_sample_cli_records_the_fields_and_the_price(tiny_dir, tmp_path, capsys):
    out = tmp_path / "lp.jsonl"
    args = ["sample", "--task", "arith", "--limit", "4", "--engine", "transformers", "--model", str(tiny_dir),
            "--n", "3", "--max-tokens", "8", "--seed", "1", "--threads", "1", "--no-progress", "--out", str(out)]
    assert main([*args, "--logprobs", "5", "--confidence-window", "4"]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    tokens = sum(x["completion_tokens"] for r in rows for x in r["samples"])
    assert f"with logprobs=5 priced as {tokens * LOGPROB_COST_FACTOR:.0f} tokens" in capsys.readouterr().out
    assert all("logprob_mean" in s and "confidence_min_window" in s for r in rows for s in r["samples"])
    meta = rows[0]["meta"]
    assert (meta["logprobs"], meta["confidence_window"], meta["logprob_cost_factor"]) == (5, 4, LOGPROB_COST_FACTOR)
    t = read_outcomes(out)
    assert not np.isnan(t.logprob_mean[t.mask]).any() and not np.isnan(t.confidence_min_window[t.mask]).any()
    # the same run without --logprobs: the same samples, no fields, no logprob meta
    plain = tmp_path / "plain.jsonl"
    assert main([*args[:-1], str(plain)]) == 0
    prow = [json.loads(x) for x in plain.read_text().splitlines()]
    strip = lambda s: {k: v for k, v in s.items() if k not in ("logprob_mean", "confidence_min_window")}  # noqa: E731
    assert [[strip(s) for s in r["samples"]] for r in rows] == [r["samples"] for r in prow]
    assert "logprobs" not in prow[0]["meta"] and read_outcomes(plain).logprob_mean is None


@pytest.mark.parametrize("kw, match", [({"logprobs": 0}, "--logprobs must be 1"),
                                       ({"logprobs": 21}, "--logprobs must be 1"),
                                       ({"confidence_window": 0}, "--confidence-window must be >= 1")])
def test_bad_options(tmp_path, kw, match):
    with pytest.raises(InputError, match=match):
        SampleConfig(task="arith", model="m", out=tmp_path / "o.jsonl", **kw)
