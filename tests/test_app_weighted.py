"""strategy "weighted" in the gateway: votes weighted by the fitted vote.json's length weights — and by the
samples' confidence when the weights have a confidence term, every wave then asking for logprobs — reported
in the ``isocompute`` object; majority unchanged and the default; refused without a vote file; end to end on
the tiny in-process model."""

from __future__ import annotations

import pytest
from app_fakes import FakeEngine, FakePolicy, completion, make_client

from isocompute.engines.base import Completion
from isocompute.solver.votes.weights import VoteWeights

# two long samples say 7, one short one says 12
SCRIPT = ("The answer is 7.", "The answer is 7.", "The answer is 12.")
LENGTHS = (50, 50, 5)


def vote_file(tmp_path, beta: float, name: str = "vote.json"):
    return VoteWeights(beta=beta, typical_tokens=20.0, fit={"k": 4, "kept": beta != 0}).save(tmp_path / name)


def post(engine, body, **settings):
    with make_client(engine, FakePolicy("none@3"), **settings) as c:
        return c.post("/v1/completions", json=completion(budget=4, seed=7, **body))


def test_weighted_vote_lets_the_short_answer_win_and_says_why(tmp_path):
    r = post(FakeEngine(SCRIPT, lengths=LENGTHS), {"strategy": "weighted"}, vote_file=vote_file(tmp_path, 2.0))
    assert r.status_code == 200, r.text
    info = r.json()["isocompute"]
    assert info["strategy"] == "weighted" and info["answer"] == "12" and info["votes"] == {"7": 2, "12": 1}
    vw = info["vote_weights"]
    assert vw["beta"] == 2.0 and vw["gamma"] == 0.0 and vw["evidence"] == ["length"] and vw["kept"] is True
    want = [(6 / 51) ** 2, (6 / 51) ** 2, 1.0]  # (t + 1)^−β, scaled to a largest weight of 1
    assert vw["weights"] == pytest.approx(want)
    assert vw["scores"] == pytest.approx({"7": 2 * want[0], "12": 1.0})
    assert r.json()["choices"][0]["text"] == "The answer is 12."


def test_majority_stays_the_default_and_unchanged_with_a_vote_file(tmp_path):
    engine = FakeEngine(SCRIPT, lengths=LENGTHS)
    plain = post(engine, {}, vote_file=vote_file(tmp_path, 2.0)).json()["isocompute"]
    assert plain["strategy"] == "majority" and plain["answer"] == "7" and plain["vote_weights"] is None
    without = post(FakeEngine(SCRIPT, lengths=LENGTHS), {}).json()["isocompute"]

    def untimed(info):
        return {**info, "latency_s": None, "wave_runs": [{**w, "seconds": None} for w in info["wave_runs"]]}

    assert untimed(without) == untimed(plain)


def test_a_vote_not_kept_is_plain_majority(tmp_path):
    info = post(FakeEngine(SCRIPT, lengths=LENGTHS), {"strategy": "weighted"},
                vote_file=vote_file(tmp_path, 0.0)).json()["isocompute"]
    assert info["answer"] == "7" and info["vote_weights"]["weights"] == [1.0, 1.0, 1.0]
    assert info["vote_weights"]["kept"] is False


def test_weighted_without_a_vote_file_is_a_400_that_says_how():
    r = post(FakeEngine(SCRIPT, lengths=LENGTHS), {"strategy": "weighted"})
    assert r.status_code == 400 and "needs a fitted vote" in r.text and "--vote" in r.text


def test_weighted_end_to_end_on_the_tiny_model(engine, tmp_path):
    """The real in-process engine: its samples' true completion tokens feed the weights."""
    path = vote_file(tmp_path, 1.0)
    with make_client(engine, FakePolicy("none@4"), vote_file=path, upstream_timeout_s=60) as c:
        body = {"budget": 4, "seed": 3, "max_tokens": 8, "temperature": 1.0}
        weighted = c.post("/v1/completions", json=completion("2 + 3 =", strategy="weighted", **body))
        majority = c.post("/v1/completions", json=completion("2 + 3 =", **body))
    assert weighted.status_code == 200 and majority.status_code == 200, (weighted.text, majority.text)
    w, m = weighted.json()["isocompute"], majority.json()["isocompute"]
    assert w["samples_received"] == m["samples_received"] == 4 and w["votes"] == m["votes"]  # the same samples
    weights = w["vote_weights"]["weights"]
    assert len(weights) == 4 and max(weights) == 1.0 and all(0 < x <= 1 for x in weights)
    scores = w["vote_weights"]["scores"]
    assert set(scores) == set(w["votes"])
    if scores:
        assert scores[w["answer"]] == pytest.approx(max(scores.values()))
    assert weighted.json()["usage"] == majority.json()["usage"]


def test_serve_takes_the_vote_file_flag(tmp_path):
    from isocompute.cli import build_parser
    from isocompute.cli.serve import settings_from_args

    path = vote_file(tmp_path, 1.0)
    assert settings_from_args(build_parser().parse_args(["serve", "--vote", str(path)])).vote_file == path
    assert settings_from_args(build_parser().parse_args(["serve"])).vote_file is None


class ConfidentEngine(FakeEngine):
    """FakeEngine whose completions carry a confidence when asked for logprobs (``confidence[j]``), and
    which records the logprobs each request call asked for."""

    def __init__(self, *a, confidence=(), **kw):
        super().__init__(*a, **kw)
        self.confidence, self.asked = tuple(confidence), []

    async def generate(self, prompts, n, max_tokens, temperature, seed=None, *, logprobs=None, confidence_window=2048):
        out = await super().generate(prompts, n, max_tokens, temperature, seed)
        if list(prompts) != ["1 + 1 ="]:
            self.asked.append(logprobs)
        if logprobs is None:
            return out
        return [[Completion(c.text, c.prompt_tokens, c.completion_tokens, c.finish_reason,
                            confidence_min_window=self.confidence[j % len(self.confidence)])
                 for j, c in enumerate(comps)] for comps in out]


def confident_vote(tmp_path):
    return VoteWeights(gamma=2.0, confidence_field="confidence_min_window", confidence_mean=2.0,
                       confidence_std=1.0, typical_tokens=20.0, fit={"k": 4, "kept": True}).save(tmp_path / "vc.json")


def test_a_confidence_weighted_vote_asks_for_logprobs_and_lets_the_confident_answer_win(tmp_path):
    """Two unsure samples say 7, one confident sample says 12: weighted by confidence (γ = 2), 12 wins; the
    waves asked for 5 logprobs — and only under that strategy."""
    engine = ConfidentEngine(SCRIPT, lengths=(5,), confidence=(1.0, 1.0, 4.0))
    r = post(engine, {"strategy": "weighted"}, vote_file=confident_vote(tmp_path))
    assert r.status_code == 200, r.text
    info = r.json()["isocompute"]
    vw = info["vote_weights"]
    assert info["answer"] == "12" and vw["confidence_used"] is True and vw["evidence"] == ["length", "confidence"]
    assert vw["weights"] == pytest.approx([pytest.approx(2.718281828 ** -6, rel=1e-6)] * 2 + [1.0])  # e^{2(c−4)}
    assert engine.asked == [5]
    plain = ConfidentEngine(SCRIPT, lengths=(5,), confidence=(1.0, 1.0, 4.0))
    majority = post(plain, {}, vote_file=confident_vote(tmp_path)).json()["isocompute"]
    assert majority["answer"] == "7" and plain.asked == [None]  # majority pays for no logprobs


def test_a_confidence_weighted_vote_prices_its_waves_at_the_logprob_factor(tmp_path):
    """A tokens budget pays a logprob wave's tokens at LOGPROB_COST_FACTOR: the key's controller sees 1.07×
    what the same samples cost under majority."""
    from isocompute.flops.logprobs import LOGPROB_COST_FACTOR

    spent = {}
    for strategy in ("weighted", "majority"):
        engine = ConfidentEngine(SCRIPT, lengths=(5,), confidence=(1.0, 1.0, 4.0))
        with make_client(engine, FakePolicy("none@3"), vote_file=confident_vote(tmp_path)) as c:
            body = completion(budget=768, budget_unit="tokens", seed=7, strategy=strategy)  # 3 samples of 256
            assert c.post("/v1/completions", json=body).status_code == 200
            [ctl] = c.app.state.gateway.controllers._items.values()
            spent[strategy] = ctl.spent
    assert spent["weighted"] == pytest.approx(LOGPROB_COST_FACTOR * spent["majority"])
