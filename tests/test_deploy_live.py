"""The CPU topology of deploy/ run without containers, checked live (docs/deploy.md, "What CI checks"):
``isocompute serve`` on the GPU overlay's own settings (rendered by kustomize: drain_timeout_s,
upstream_timeout_s, retry_after_s…), its upstream a pool ``m`` — ``isocompute replay`` (docs/replay.md, its own
process) on a three-row outcome table (:data:`ROWS`: a 2-token answer, a 1.5 s and a 6 s one at the replay's
stated decode rate), with the tiny model's tokenizer and config, fixed action ``m/none@1`` — ``redis-server`` as the
quota store, and Prometheus (Debian's) scraping the gateway every second with the real alert rules (their
``for`` set to 0 s: promtool's tests in test_deploy_manifests.py check the durations). Traffic is sent, then
every dashboard query is evaluated through Prometheus's HTTP API and must return data, and no alert fires;
then each alert is provoked in turn — a budget the fixed action cannot reach, Redis killed, the upstream
killed — and must fire. Last, SIGTERM under load: the drain is scraped, no request is cut, the process
exits 0 within the grace period less the preStop, and the gateway-down alert fires.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import httpx
import pytest
import yaml
from deploy_tools import DASHBOARD, RULES, find, render, tool

from isocompute.app.accounting.auth import hash_key
from isocompute.engines.vllm_server import free_port
from isocompute.replay.process import start_replay

REPO = Path(__file__).resolve().parents[1]
RATE = "10s"  # Grafana's $__rate_interval at a 1 s scrape
# The replay's rows (prompt, recorded answer, completion tokens): a 2-token answer, and two answers whose
# length at DECODE_TPS tokens/s per sequence makes a 1.5 s and a 6 s request for the drain under load.
DECODE_TPS = 20  # the tiny model's 512-token context bounds max_tokens (200 here)
QUICK, SLOW, SLOWEST = "What is 5 + 7?", "Take a while: what is 6 + 9?", "Take longer still: what is 8 + 9?"
ROWS = [(QUICK, "12", 2), (SLOW, "15", int(1.5 * DECODE_TPS)), (SLOWEST, "17", 6 * DECODE_TPS)]


def wait_for(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.25)


def http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


class Topology:
    """The processes of the live topology, each started (and stopped) by this test only."""

    def __init__(self, tmp: Path, tiny_dir: Path) -> None:
        self.tmp, self.tiny_dir, self.procs = tmp, tiny_dir, {}
        self.up_port, self.redis_port, self.gw_port, self.prom_port = (free_port() for _ in range(4))
        self.gw = f"http://127.0.0.1:{self.gw_port}"
        self.prom = f"http://127.0.0.1:{self.prom_port}"

    def spawn(self, name: str, cmd: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 — closed with the process
        self.procs[name] = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                            env={**os.environ, **(env or {})}, start_new_session=True)
        return self.procs[name]

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")[-3000:]

    def upstream(self) -> None:
        """``isocompute replay`` on :data:`ROWS` as model ``m``, its own process (killed by :meth:`stop`)."""
        table = self.tmp / "replay.jsonl"
        if not table.exists():
            table.write_text("".join(json.dumps(
                {"id": f"r{i}", "prompt": p, "prompt_tokens": 8, "meta": {"task": "gsm8k", "model": "m"},
                 "samples": [{"answer": a, "completion_tokens": k}] * 4}) + "\n" for i, (p, a, k) in enumerate(ROWS)))
        rp = start_replay([table], self.up_port, log=self.tmp / "upstream.log", decode_tps=DECODE_TPS,
                          max_tps=1e6, stream_interval=10)
        self.procs["upstream"] = rp.process

    def start(self) -> None:
        self.spawn("redis", [tool("redis-server"), "--port", str(self.redis_port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no"])
        self.upstream()
        keys = self.tmp / "keys.json"
        keys.write_text(json.dumps({"keys": [{"name": "team-a", "sha256": hash_key("key-a")},
                                             {"name": "team-q", "sha256": hash_key("key-q"), "tokens_per_window": 10}]}))
        objs = render("gpu")
        self.conf = tomllib.loads(find(objs, "ConfigMap", "isocompute-config")["data"]["isocompute.toml"])
        pod = find(objs, "Deployment", "isocompute-gateway")["spec"]["template"]["spec"]
        self.stop_budget_s = pod["terminationGracePeriodSeconds"] - float(
            pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][1])
        conf = {k: v for k, v in self.conf.items() if k != "upstreams"} | {
            "host": "127.0.0.1", "port": self.gw_port, "action": "m/none@1", "api_keys_file": str(keys),
            "quota_store": f"redis://127.0.0.1:{self.redis_port}/0",
            "ready_interval_s": 1.0, "ready_probe_timeout_s": 2.0}  # the upstream's death seen within a second
        pools = (f'model_upstreams = {{m = ["http://127.0.0.1:{self.up_port}"]}}\n'
                 f'model_dirs = {{m = "{self.tiny_dir}"}}\n')
        (self.tmp / "gateway.toml").write_text(pools + "\n".join(f"{k} = {json.dumps(v)}" for k, v in conf.items()))
        self.spawn("gateway", [sys.executable, "-m", "isocompute", "serve", "--config", str(self.tmp / "gateway.toml"),
                               "--log-level", "warning"])
        self.prometheus()
        wait_for(lambda: self.procs["gateway"].poll() is not None or http_ok(f"{self.gw}/ready"), 120,
                 "the gateway ready")
        assert self.procs["gateway"].poll() is None, self.log("gateway")

    def prometheus(self) -> None:
        spec = yaml.safe_load(RULES.read_text())["spec"]
        for g in spec["groups"]:
            for r in g["rules"]:
                r["for"] = "0s"
        (self.tmp / "rules.yml").write_text(yaml.safe_dump(spec))
        (self.tmp / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": ["rules.yml"],
            "scrape_configs": [{"job_name": "isocompute-gateway", "scrape_timeout": "1s",
                                "static_configs": [{"targets": [f"127.0.0.1:{self.gw_port}"]}]}]}))
        self.spawn("prometheus", [tool("prometheus"), f"--config.file={self.tmp / 'prometheus.yml'}",
                                  f"--storage.tsdb.path={self.tmp / 'tsdb'}",
                                  f"--web.listen-address=127.0.0.1:{self.prom_port}"])
        wait_for(lambda: http_ok(f"{self.prom}/-/ready"), 30, "Prometheus ready")

    def query(self, expr: str) -> list[dict]:
        r = httpx.get(f"{self.prom}/api/v1/query", params={"query": expr}, timeout=5).json()
        assert r["status"] == "success", (expr, r)
        return r["data"]["result"]

    def firing(self) -> set[str]:
        alerts = httpx.get(f"{self.prom}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
        return {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}

    def ask(self, key: str = "key-a", budget: float = 1, prompt: str = QUICK, timeout: float = 30, max_tokens: int = 8):
        return httpx.post(f"{self.gw}/v1/completions", headers={"Authorization": f"Bearer {key}"}, timeout=timeout,
                          json={"model": "isocompute", "prompt": prompt, "budget": budget, "max_tokens": max_tokens})

    def stop(self, name: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs.get(name)
        if p is not None and p.poll() is None:
            os.killpg(p.pid, sig)
            p.wait(30)

    def close(self) -> None:
        for name in list(self.procs):
            self.stop(name)


@pytest.fixture(scope="module")
def topo(tiny_dir, tmp_path_factory):
    t = Topology(tmp_path_factory.mktemp("live"), tiny_dir)
    try:
        t.start()
        yield t
    finally:
        t.close()


def dashboard_queries() -> list[tuple[str, str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(p["title"], t["expr"].replace("$__rate_interval", RATE)) for p in panels for t in p.get("targets", [])]


def test_every_dashboard_query_returns_data_and_no_alert_fires(topo):
    for _ in range(12):
        assert topo.ask().status_code == 200
    # 10 tokens a window: a request reserves its worst case (8), is charged what it generated (2): 429 soon
    codes = [topo.ask("key-q").status_code for _ in range(6)]
    assert codes[0] == 200 and 429 in codes, codes
    time.sleep(3)  # a few scrapes and rule evaluations after the traffic
    empty = [(title, q) for title, q in dashboard_queries() if not topo.query(q)]
    assert not empty, empty
    assert topo.query('isocompute_upstream_circuit{state="closed"} == 1')
    assert topo.firing() == set(), topo.firing()


def test_a_budget_the_action_cannot_reach_fires_spend_off_budget(topo):
    for _ in range(3):
        assert topo.ask(budget=4).status_code == 200  # the fixed action draws 1 sample of the 4 asked
    got = wait_for(lambda: "IsocomputeSpendOffBudget" in topo.firing(), 15, "IsocomputeSpendOffBudget")
    assert got
    assert {r["metric"]["budget_key"] for r in topo.query("ALERTS{alertname='IsocomputeSpendOffBudget'}")} == {
        "team-a:4samples"}


def test_redis_killed_fires_quota_store_unreachable(topo):
    topo.stop("redis")
    r = topo.ask("key-q")
    assert r.status_code == 503 and "quota store" in r.text
    wait_for(lambda: "IsocomputeQuotaStoreUnreachable" in topo.firing(), 15, "IsocomputeQuotaStoreUnreachable")


def test_upstream_killed_fires_upstream_down_and_recovers(topo):
    topo.stop("upstream")
    for _ in range(6):
        assert topo.ask().status_code >= 500
    wait_for(lambda: {"IsocomputeUpstreamDown", "Isocompute5xxRate"} <= topo.firing(), 20,
             "IsocomputeUpstreamDown and Isocompute5xxRate")
    assert topo.query('isocompute_upstream_circuit{state="closed"} == 0')
    topo.upstream()  # back on the same port: readiness and the alert recover
    wait_for(lambda: "IsocomputeUpstreamDown" not in topo.firing(), 30, "IsocomputeUpstreamDown resolved")


def test_sigterm_under_load_cuts_no_request_and_the_gateway_goes_down(topo):
    """6 clients keep sending 1.5 s requests and one 6 s request is in flight; SIGTERM. The drain is scraped;
    the 7 requests in flight at the signal (each client's last one sent before it) are answered 200 — none
    cut —; every later one is refused: 503 ``draining``, or, once the listener closes, a connection refused
    or reset before the server read it; the process exits 0 within the grace period less the preStop
    sleep; then the gateway-down alert fires."""
    results: list[tuple[float, str]] = []
    stop = threading.Event()

    def client(who: int, prompt: str, once: bool = False) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                r = topo.ask(prompt=prompt, timeout=topo.conf["upstream_timeout_s"] + 5, max_tokens=200)
                code = str(r.status_code) if r.status_code != 503 else f"503 {r.json()['error']['code']}"
            except httpx.ConnectError:
                code = "refused"
            except httpx.TransportError as e:  # after the signal: the listener closed before reading it
                code = f"cut: {type(e).__name__}"
            results.append((who, t0, time.monotonic(), code))
            if once or code == "refused":
                return
            if code != "200":
                time.sleep(0.2)  # a client told to retry elsewhere does not spin on this replica

    clients = [threading.Thread(target=client, args=(i, SLOW)) for i in range(6)]
    clients.append(threading.Thread(target=client, args=(6, SLOWEST, True)))
    for c in clients:
        c.start()
    wait_for(lambda: topo.query("isocompute_requests_inflight >= 7") or not all(r[3] == "200" for r in results),
             15, "7 requests in flight")
    assert all(r[3] == "200" for r in results), (results, topo.log("gateway"), topo.log("upstream"))
    gw = topo.procs["gateway"]
    t_signal = time.monotonic()
    gw.send_signal(signal.SIGTERM)
    wait_for(lambda: topo.query("isocompute_draining == 1"), 5, "isocompute_draining = 1 scraped")
    assert gw.wait(topo.stop_budget_s) == 0, topo.log("gateway")
    exit_s = time.monotonic() - t_signal
    stop.set()
    for c in clients:
        c.join(30)
    in_flight = [max((r for r in results if r[0] == who and r[1] < t_signal), key=lambda r: r[1]) for who in range(7)]
    assert [r[3] for r in in_flight] == ["200"] * 7 and all(r[2] > t_signal for r in in_flight), (t_signal, results)
    later = {r[3] for r in results if r[1] > t_signal}
    assert later <= {"503 draining", "refused", "cut: ReadError", "cut: RemoteProtocolError"}, results
    c = topo.conf
    assert exit_s <= c["upstream_timeout_s"] < c["drain_timeout_s"] < topo.stop_budget_s, exit_s
    wait_for(lambda: "IsocomputeGatewayDown" in topo.firing(), 15, "IsocomputeGatewayDown")
