"""Per-wave timing and the wave metrics (issue 21): each wave's seconds and, streamed, its first token; the
Prometheus histograms and counters by plan family, observed once per round (Metrics.observe_wave); the
tokens a replayed stop saved; a measured wave overhead from a scrape (isocompute.evaluation.wave_overhead)
and ``isocompute report --wave-overhead SCRAPE``."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import httpx
import pytest
from app_fakes import FakeEngine, FakePolicy, completion, make_client
from prometheus_client.parser import text_string_to_metric_families

from isocompute.engines.base import Completion, replay_finishes
from isocompute.errors import InputError
from isocompute.evaluation.wave_overhead import measure, overhead_arg, read_scrape, resolve_overhead

UNANIMOUS = ("The answer is 12.",)
SPLIT = ("The answer is 12.", "The answer is 7.")
FIRST_TOKEN_S, STREAM_S = 0.05, 0.2


class StreamingFake(FakeEngine):
    """A FakeEngine with a stream of its own: the wave replayed after ``STREAM_S`` s, its first token at
    ``FIRST_TOKEN_S`` s, what its stop saved unknown (as a real stream's)."""

    async def stream_wave(self, prompt, n, max_tokens, temperature, seed, on_finish):
        [comps] = await self.generate([prompt], n, max_tokens, temperature, seed)
        await asyncio.sleep(STREAM_S)
        ws = await replay_finishes(list(comps), on_finish)
        return dataclasses.replace(ws, first_token_s=FIRST_TOKEN_S, saved_tokens=None)


def run(engine, plan, n_requests=1, **body):
    with make_client(engine, FakePolicy(plan)) as c:
        for _ in range(n_requests):
            r = c.post("/v1/completions", json=completion(**{"budget": 4, **body}))
            assert r.status_code == 200, r.text
        return r.json()["isocompute"], c.get("/metrics").text


def samples(scrape: str) -> dict[tuple[str, tuple], float]:
    """Every sample of a scrape: (name, sorted labels without le) → value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(scrape) for s in f.samples if "le" not in s.labels}


def lab(**kw):
    return tuple(sorted(kw.items()))


def test_a_waiting_wave_then_a_parallel_one_is_timed_and_counted():
    # wave 1 waits for 2 samples of 5 tokens; wave 2 (parallel-stop) finishes at 2, 4, 6 and aborts 9, 7, 8 at 6
    engine = FakeEngine(SPLIT + UNANIMOUS * 6, continuing=True, lengths=(5, 5, 2, 9, 4, 7, 8, 6))
    info, scrape = run(engine, "lead:m=3@2,6s")
    assert [(w["mode"], w["ended"]) for w in info["wave_runs"]] == [("wait", "finished"), ("parallel-stop", "rule")]
    s = samples(scrape)
    lead = lab(family="lead", pool="default")
    for mode in ("wait", "parallel-stop"):
        assert s[("isocompute_wave_latency_seconds_count", lab(family="lead", mode=mode, pool="default"))] == 1
    assert s[("isocompute_wave_decode_tokens_total", lead)] == 5 + 6  # each wave's longest sample
    assert s[("isocompute_aborted_tokens_saved_total", lab(pool="default"))] == (9 + 7 + 8) - 3 * 6
    assert s[("isocompute_plan_latency_seconds_count", lead)] == 1
    assert s[("isocompute_plan_latency_seconds_sum", lead)] >= sum(
        s[("isocompute_wave_latency_seconds_sum", lab(family="lead", mode=m, pool="default"))]
        for m in ("wait", "parallel-stop"))
    assert ("isocompute_wave_first_token_seconds_count", lead) not in s  # a replay streams no first token
    assert ("isocompute_stream_decode_tokens_total", lead) not in s


def test_a_waiting_plan_has_no_first_token_and_no_saved_tokens():
    info, scrape = run(FakeEngine(UNANIMOUS, lengths=(5, 9, 4)), "none@3", n_requests=2)
    assert info["stopped"] == "plan_end"
    s = samples(scrape)
    none = lab(family="none", pool="default")
    assert s[("isocompute_wave_latency_seconds_count", lab(family="none", mode="wait", pool="default"))] == 2
    assert s[("isocompute_wave_decode_tokens_total", none)] == 2 * 9
    assert s[("isocompute_plan_latency_seconds_count", none)] == 2
    assert ("isocompute_wave_first_token_seconds_count", none) not in s
    assert s[("isocompute_aborted_tokens_saved_total", lab(pool="default"))] == 0  # created at 0 at start-up


def test_a_plan_stopped_by_a_failing_wave_has_its_latency_too():
    from isocompute.errors import EngineUnavailable

    engine = FakeEngine(SPLIT, continuing=True, fail=EngineUnavailable("upstream down"), fail_after=1)
    info, scrape = run(engine, "lead:m=3@1,1,2")
    assert (info["stopped"], info["waves"]) == ("upstream_error", 1)
    s = samples(scrape)
    assert s[("isocompute_plan_latency_seconds_count", lab(family="lead", pool="default"))] == 1
    assert s[("isocompute_wave_latency_seconds_count", lab(family="lead", mode="wait", pool="default"))] == 1


def test_a_streamed_wave_has_its_first_token_and_decode_seconds_and_they_give_the_overhead():
    lengths = (9, 3, 7, 5, 11, 8, 6, 10)  # the first two finishers (3, 5) agree: stopped, the rest aborted at 5
    info, scrape = run(StreamingFake(UNANIMOUS, lengths=lengths), "lead:m=2@8s", n_requests=2)
    assert info["stopped"] == "rule"
    s = samples(scrape)
    lead = lab(family="lead", pool="default")
    wave = s[("isocompute_wave_latency_seconds_sum", lab(family="lead", mode="parallel-stop", pool="default"))]
    assert s[("isocompute_wave_first_token_seconds_count", lead)] == 2
    assert s[("isocompute_wave_first_token_seconds_sum", lead)] == pytest.approx(2 * FIRST_TOKEN_S)
    assert s[("isocompute_wave_decode_seconds_count", lead)] == 2
    assert s[("isocompute_wave_decode_seconds_sum", lead)] == pytest.approx(wave - 2 * FIRST_TOKEN_S)
    assert wave >= 2 * STREAM_S
    assert s[("isocompute_wave_decode_tokens_total", lead)] == s[("isocompute_stream_decode_tokens_total", lead)] == 10
    assert s[("isocompute_aborted_tokens_saved_total", lab(pool="default"))] == 0  # unknown for a stream
    m = measure(scrape)
    assert m.waves == 2 and m.tokens == 10
    assert m.overhead_s == pytest.approx(FIRST_TOKEN_S)
    assert m.s_per_token == pytest.approx((wave - 2 * FIRST_TOKEN_S) / 10)


def test_replay_saves_the_aborted_samples_unfinished_tokens():
    comps = [Completion(t, 4, n) for t, n in (("a", 300), ("b", 120), ("a", 200), ("a", 900))]

    async def first(j, c):
        return True

    async def never(j, c):
        return False

    ws = asyncio.run(replay_finishes(comps, first))
    full = sum(c.completion_tokens for c in comps)
    assert ws.saved_tokens == full - ws.tokens == (300 - 120) + (200 - 120) + (900 - 120)
    assert ws.first_token_s is None
    assert asyncio.run(replay_finishes(comps, never)).saved_tokens == 0


def test_the_vllm_stream_times_its_first_token():
    from test_engines_http import MODEL, sse_body

    from isocompute.engines.vllm_http import VLLMHTTPEngine

    async def serve(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": MODEL}]})
        return httpx.Response(200, content=sse_body(3, "p"))

    async def go(stop_after):
        eng = VLLMHTTPEngine(["http://a:1"], transport=httpx.MockTransport(serve))
        seen = []

        async def on_finish(j, c):
            seen.append(j)
            return len(seen) == stop_after

        try:
            return await eng.stream_wave("p", 3, 8, 1.0, None, on_finish)
        finally:
            await eng.aclose()

    whole, stopped = asyncio.run(go(None)), asyncio.run(go(1))
    assert whole.first_token_s is not None and whole.first_token_s >= 0 and whole.saved_tokens == 0
    assert stopped.stopped and stopped.first_token_s is not None and stopped.saved_tokens is None


SCRAPE = """\
# HELP isocompute_wave_first_token_seconds A streamed wave's send to its first token
# TYPE isocompute_wave_first_token_seconds histogram
isocompute_wave_first_token_seconds_bucket{family="lead",le="+Inf",pool="default"} 3.0
isocompute_wave_first_token_seconds_count{family="lead",pool="default"} 3.0
isocompute_wave_first_token_seconds_sum{family="lead",pool="default"} 0.5
isocompute_wave_first_token_seconds_bucket{family="first",le="+Inf",pool="big"} 1.0
isocompute_wave_first_token_seconds_count{family="first",pool="big"} 1.0
isocompute_wave_first_token_seconds_sum{family="first",pool="big"} 0.3
# HELP isocompute_wave_decode_seconds A streamed wave's seconds after its first token
# TYPE isocompute_wave_decode_seconds histogram
isocompute_wave_decode_seconds_count{family="lead",pool="default"} 3.0
isocompute_wave_decode_seconds_sum{family="lead",pool="default"} 4.0
isocompute_wave_decode_seconds_count{family="first",pool="big"} 1.0
isocompute_wave_decode_seconds_sum{family="first",pool="big"} 2.0
# HELP isocompute_stream_decode_tokens_total Completion tokens of each streamed wave's longest sample
# TYPE isocompute_stream_decode_tokens_total counter
isocompute_stream_decode_tokens_total{family="lead",pool="default"} 200.0
isocompute_stream_decode_tokens_total{family="first",pool="big"} 100.0
# HELP isocompute_wave_decode_tokens_total Completion tokens of each wave's longest sample
# TYPE isocompute_wave_decode_tokens_total counter
isocompute_wave_decode_tokens_total{family="lead",pool="default"} 900.0
"""


def test_the_overhead_of_a_hand_written_scrape_is_its_arithmetic():
    m = measure(SCRAPE, "hand")
    assert m.waves == 4 and m.tokens == 300
    assert m.overhead_s == pytest.approx((0.5 + 0.3) / 4, rel=1e-12)  # 0.2 s per wave to its first token
    assert m.s_per_token == pytest.approx((4.0 + 2.0) / 300, rel=1e-12)  # 0.02 s per token (streamed waves only)
    assert m.in_samples(50) == pytest.approx(0.2 / (0.02 * 50), rel=1e-12)  # 50 tokens = 1 s: O = 0.2


def test_resolve_overhead_reads_a_file_and_passes_numbers_through(tmp_path):
    path = tmp_path / "scrape.txt"
    path.write_text(SCRAPE)
    assert overhead_arg("0.5") == 0.5 and overhead_arg(str(path)) == str(path)
    assert resolve_overhead(0.5, None) == (0.5, None)
    o, src = resolve_overhead(str(path), 25.0)
    assert o == pytest.approx(0.2 / (0.02 * 25), rel=1e-12)
    assert src["scrape"] == str(path) and src["waves"] == 4 and src["overhead"] == o
    assert src["overhead_s"] == pytest.approx(0.2) and src["s_per_token"] == pytest.approx(0.02)


@pytest.mark.parametrize(("text", "message"), [
    ("", "no streamed waves"),
    ("# TYPE isocompute_requests_total counter\nisocompute_requests_total 3.0\n", "no streamed waves"),
    ('isocompute_wave_first_token_seconds_count{family="lead",pool="default"} 2.0\n'
     'isocompute_wave_first_token_seconds_sum{family="lead",pool="default"} 0.2\n', "no decode time"),
    ("this is { not a scrape", "not a Prometheus text scrape"),
])
def test_a_scrape_without_streamed_waves_is_an_input_error(text, message):
    with pytest.raises(InputError, match=message):
        measure(text)


def test_an_unreadable_scrape_or_a_table_without_tokens_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="neither a number nor a readable metrics scrape"):
        read_scrape(str(tmp_path / "missing.txt"))
    with pytest.raises(InputError, match="could not fetch"):
        read_scrape("http://127.0.0.1:9/metrics")
    with pytest.raises(InputError, match="tokens per sample"):
        resolve_overhead(str(tmp_path / "missing.txt"), None)


@pytest.mark.slow
def test_report_takes_the_overhead_from_a_scrape(tmp_path):
    from test_report_latency import FIT_FLAGS, REPORT_FLAGS, _records, _write

    from isocompute.cli import main

    table = _write(tmp_path / "train.jsonl", _records(60, seed=3))
    scrape = tmp_path / "scrape.txt"
    scrape.write_text(SCRAPE)
    assert main(["fit", str(table), "--out", str(tmp_path / "pol"), *FIT_FLAGS]) == 0
    assert main(["report", "--policy", str(tmp_path / "pol"), str(table), "--out", str(tmp_path / "rep"),
                 "--wave-overhead", str(scrape), *REPORT_FLAGS]) == 0
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    unit = rep["latency_unit_tokens"]
    assert rep["wave_overhead"] == pytest.approx(0.2 / (0.02 * unit), rel=1e-12)
    src = rep["wave_overhead_source"]
    assert src["scrape"] == str(scrape) and src["waves"] == 4 and src["tokens_per_sample"] == unit
    assert "measured on the gateway metrics scrape" in (tmp_path / "rep" / "report.md").read_text()
    manifest = json.loads((tmp_path / "rep" / "manifest.json").read_text())
    assert manifest["params"]["wave_overhead"] == rep["wave_overhead"]
    dest = tmp_path / "rep-bad"
    assert main(["report", "--policy", str(tmp_path / "pol"), str(table), "--out", str(dest),
                 "--wave-overhead", str(tmp_path / "none.txt"), *REPORT_FLAGS]) == 2
    assert not dest.exists()
