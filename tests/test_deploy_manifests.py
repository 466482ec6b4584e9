"""deploy/ checked by the real tools (docs/deploy.md): every overlay rendered by ``kubectl kustomize`` and
validated against the Kubernetes schema in strict mode (kubernetes-validate), yamllint, the compose file
parsed by docker-compose, the settings files read by the gateway's own Settings, the drain numbers summed,
the alert rules and every dashboard query parsed by promtool, and each alert's firing (``for`` included)
checked by ``promtool test rules`` on series written out here. Against a live gateway: test_deploy_live.py.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from deploy_tools import DASHBOARD, DEPLOY, OVERLAYS, RULES, alert_rules, find, render, tool

from isocompute.app.accounting.auth import load_key_file
from isocompute.app.readiness import CLOSE_GRACE_S
from isocompute.app.settings import Settings

K8S_VERSION = "1.32.0"
CRDS = {"ServiceMonitor", "PrometheusRule", "ScaledObject"}  # kubernetes-validate bundles no CRD schemas
LIFESPAN_SHUTDOWN_S = 5.0  # main.lifespan waits at most 5 s for the readiness task, then closes the engines
COMPOSE = DEPLOY / "compose" / "compose.yaml"


def dashboard_queries() -> list[str]:
    """Every query of the dashboard, Grafana's ``$__rate_interval`` written as the 1m it means at a 15 s scrape."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"].replace("$__rate_interval", "1m") for p in panels for t in p.get("targets", [])]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_renders_and_is_valid_in_strict_mode(overlay):
    import kubernetes_validate

    objs = render(overlay)
    kinds = {o["kind"] for o in objs}
    assert {"Deployment", "Service", "ConfigMap", "Secret", "PodDisruptionBudget", "ServiceMonitor",
            "PrometheusRule"} <= kinds
    assert ("ScaledObject" in kinds) == (overlay == "keda") and ("HorizontalPodAutoscaler" in kinds) == (overlay != "keda")
    for o in objs:
        if o["kind"] not in CRDS:
            kubernetes_validate.validate(o, K8S_VERSION, strict=True)
    assert any(o["kind"] == "Deployment" and o["metadata"]["name"] == "isocompute-vllm" for o in objs) == (overlay != "cpu")


def test_strict_validation_refuses_a_misspelt_field():
    import kubernetes_validate

    dep = copy.deepcopy(find(render("gpu"), "Deployment", "isocompute-gateway"))
    dep["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/ready", "port": 8000}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, K8S_VERSION, strict=True)


def test_yamllint_is_clean():
    out = subprocess.run([tool("yamllint"), "-c", str(DEPLOY / ".yamllint"), "-f", "parsable", str(DEPLOY)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


PROFILES = ("gpu", "cpu", "replay")


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_file_parses_with_each_profile(profile):
    out = subprocess.run([tool("docker-compose"), "-f", str(COMPOSE), "--profile", profile, "config"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    services = yaml.safe_load(out.stdout)["services"]
    assert {f"gateway-{profile}", "redis", "prometheus", "grafana"} <= set(services)
    # compose v1 lists every service; a profile starts those without one and those it names
    started = {n for n, d in services.items() if profile in d.get("profiles", [profile])}
    assert {f"gateway-{p}" for p in PROFILES} & started == {f"gateway-{profile}"}
    assert ("vllm" in started) == (profile == "gpu") and ("replay" in started) == (profile == "replay")


def test_the_compose_replay_profile_runs_isocompute_replay_on_the_baked_demo_behind_the_gateway():
    """The replay service's command is one `isocompute replay` accepts (its own parser), on the table the image
    bakes (the outcomes the embedded policy was fitted on), listening where the gateway's upstream points."""
    from isocompute.cli import build_parser

    services = yaml.safe_load(COMPOSE.read_text())["services"]
    cmd = services["replay"]["command"]
    assert cmd[:2] == ["isocompute", "replay"], cmd
    args = build_parser().parse_args(cmd[1:])
    assert args.tables == [Path("/opt/isocompute/demo/outcomes.jsonl")] and args.host == "0.0.0.0"
    assert args.model == "/opt/isocompute/demo/tiny-sft"  # named as vLLM would serve the embedded default's model
    env = services["gateway-replay"]["environment"]
    assert env["ISOCOMPUTE_ENGINE"] == "vllm-http" and json.loads(env["ISOCOMPUTE_UPSTREAMS"]) == [
        f"http://replay:{args.port}"]
    assert "replay" in services["gateway-replay"]["depends_on"]


def test_compose_parser_refuses_a_broken_file(tmp_path):
    data = yaml.safe_load(COMPOSE.read_text())
    data["services"]["redis"]["restart_policy"] = "always"  # not a compose key (restart is)
    broken = tmp_path / "compose.yaml"
    broken.write_text(yaml.safe_dump(data))
    out = subprocess.run([tool("docker-compose"), "-f", str(broken), "config", "-q"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0 and "restart_policy" in out.stderr


def settings_of(objs: list[dict]) -> dict:
    return tomllib.loads(find(objs, "ConfigMap", "isocompute-config")["data"]["isocompute.toml"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_configmap_and_the_keys_secret_are_what_the_gateway_reads(overlay, tmp_path):
    objs = render(overlay)
    s = Settings(**settings_of(objs))  # extra="forbid": a misspelt field fails here
    assert s.engine == ("transformers" if overlay == "cpu" else "vllm-http")
    assert s.quota_store.startswith("redis://isocompute-redis:6379")
    keys = tmp_path / "keys.json"
    keys.write_text(find(objs, "Secret", "isocompute-api-keys")["stringData"]["keys.json"])
    assert load_key_file(keys) == []
    Settings(**tomllib.loads((DEPLOY / "compose" / "isocompute.toml").read_text()))


def prestop_s(container: dict) -> float:
    return float(container["lifecycle"]["preStop"]["exec"]["command"][1])


def test_the_shutdown_numbers_add_up():
    """preStop + drain_timeout_s + uvicorn's close + the lifespan's shutdown fit the termination grace period,
    and no request outlives the drain (its deadline, upstream_timeout_s, is shorter) — docs/deploy.md."""
    objs = render("gpu")
    s = settings_of(objs)
    pod = find(objs, "Deployment", "isocompute-gateway")["spec"]["template"]["spec"]
    gw = pod["containers"][0]
    assert s["upstream_timeout_s"] < s["drain_timeout_s"]
    worst = prestop_s(gw) + s["drain_timeout_s"] + CLOSE_GRACE_S + LIFESPAN_SHUTDOWN_S
    assert worst <= pod["terminationGracePeriodSeconds"], worst
    assert (prestop_s(gw), s["drain_timeout_s"], pod["terminationGracePeriodSeconds"]) == (15, 45, 75)
    vpod = find(objs, "Deployment", "isocompute-vllm")["spec"]["template"]["spec"]
    args = vpod["containers"][0]["args"]
    shutdown = float(args[args.index("--shutdown-timeout") + 1])
    assert prestop_s(vpod["containers"][0]) + shutdown < vpod["terminationGracePeriodSeconds"]
    for o in OVERLAYS:
        assert settings_of(render(o))["drain_timeout_s"] == s["drain_timeout_s"]
    grace = yaml.safe_load(COMPOSE.read_text())["x-gateway"]["stop_grace_period"]
    assert s["drain_timeout_s"] + CLOSE_GRACE_S + LIFESPAN_SHUTDOWN_S <= float(grace.rstrip("s"))


def test_alert_rules_pass_promtool_and_compose_has_the_same(tmp_path):
    spec = yaml.safe_load(RULES.read_text())["spec"]
    plain = tmp_path / "rules.yml"
    plain.write_text(yaml.safe_dump(spec))
    out = subprocess.run([tool("promtool"), "check", "rules", str(plain)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert yaml.safe_load((DEPLOY / "compose" / "prometheus" / "alerts.yml").read_text()) == spec
    names = [r["alert"] for r in alert_rules()]
    assert {"IsocomputeUpstreamDown", "Isocompute5xxRate", "IsocomputeSpendOffBudget",
            "IsocomputeQuotaStoreUnreachable", "IsocomputeDrainStuck"} <= set(names)


def test_every_dashboard_query_parses(tmp_path):
    queries = dashboard_queries()
    assert len(queries) >= 20
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:q{i}", "expr": q} for i, q in enumerate(queries)]}]}
    f = tmp_path / "q.yml"
    f.write_text(yaml.safe_dump(rules))
    out = subprocess.run([tool("promtool"), "check", "rules", str(f)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    names = {m for q in queries for m in re.findall(r"\b(isocompute_[a-z_]+)", q)}
    assert {"isocompute_upstream_up", "isocompute_upstream_circuit", "isocompute_budget_target",
            "isocompute_mean_cost", "isocompute_aborted_tokens_saved_total"} <= names


# One promtool unit test per alert: the series that provoke it, and a calm one that must not.
ALERT_CASES = {
    "IsocomputeUpstreamDown": ('isocompute_upstream_up{pool="default"}', "1x2 0x8", "7m",
                               'isocompute_upstream_up{pool="default"}', "1x10"),
    "IsocomputeGatewayDown": ('up{job="isocompute-gateway"}', "1x2 0x8", "7m", 'up{job="isocompute-gateway"}', "1x10"),
    "Isocompute5xxRate": ('isocompute_requests_total{route="/v1/completions",status="503"}', "0+30x20", "10m",
                          'isocompute_requests_total{route="/v1/completions",status="503"}', "0x20"),
    "IsocomputeQuotaStoreUnreachable": ("isocompute_quota_store_errors_total", "0 0 3 3", "3m",
                                        "isocompute_quota_store_errors_total", "0x8"),
    "IsocomputeDrainStuck": ("isocompute_drain_seconds", "0 60", "1m", "isocompute_drain_seconds", "0 30"),
}


def promtool_case(alert: str, series: str, values: str, at: str, fires: bool) -> dict:
    extra = [{"series": 'isocompute_requests_total{route="/v1/completions",status="200"}', "values": "0+60x20"}]
    return {"interval": "1m", "input_series": [{"series": series, "values": values}] + extra,
            "alert_rule_test": [{"eval_time": at, "alertname": alert,
                                 "exp_alerts": [{}] if fires else []}]}


def test_each_alert_fires_when_provoked_and_is_quiet_otherwise(tmp_path):
    spec = yaml.safe_load(RULES.read_text())["spec"]
    for g in spec["groups"]:
        for r in g["rules"]:
            r.pop("annotations")  # promtool compares them in full; their templates are checked above
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(spec))
    tests = []
    for alert, (series, values, at, calm, calm_values) in ALERT_CASES.items():
        tests.append(promtool_case(alert, series, values, at, True))
        tests.append(promtool_case(alert, calm, calm_values, at, False))
    # spend off budget: a realised mean of 1 against 4 asked fires after its 15 min, 3.9 against 4 never does
    off = {"interval": "1m", "input_series": [
        {"series": 'isocompute_mean_cost{budget_key="k:4samples"}', "values": "1x30"},
        {"series": 'isocompute_budget_target{budget_key="k:4samples"}', "values": "4x30"},
        {"series": 'isocompute_mean_cost{budget_key="j:4samples"}', "values": "3.9x30"},
        {"series": 'isocompute_budget_target{budget_key="j:4samples"}', "values": "4x30"}],
        "alert_rule_test": [
            {"eval_time": "10m", "alertname": "IsocomputeSpendOffBudget", "exp_alerts": []},
            {"eval_time": "20m", "alertname": "IsocomputeSpendOffBudget", "exp_alerts": [{
                "exp_labels": {"budget_key": "k:4samples", "severity": "warning"}}]}]}
    tests.append(off)
    _fill_labels(tests, spec)
    f = tmp_path / "test.yml"
    f.write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": tests}))
    out = subprocess.run([tool("promtool"), "test", "rules", str(f)], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def _fill_labels(tests: list[dict], spec: dict) -> None:
    """promtool compares an expected alert's labels in full: each firing alert's are its series' (none where
    the rule aggregates them away) and the rule's."""
    rules = {r["alert"]: r for g in spec["groups"] for r in g["rules"]}
    for t in tests:
        for case in t["alert_rule_test"]:
            for exp in case["exp_alerts"]:
                if "exp_labels" not in exp:
                    exp["exp_labels"] = _labels(t["input_series"][0]["series"], case["alertname"], rules)


def _labels(series: str, alert: str, rules: dict) -> dict:
    labels = dict(re.findall(r'(\w+)="([^"]*)"', series))
    if alert in ("Isocompute5xxRate", "IsocomputeQuotaStoreUnreachable"):
        labels = {}  # aggregated by job (none on these series) / increase() drops the metric name only
    return {**labels, **rules[alert].get("labels", {})}


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_the_images_entrypoint_serves_the_baked_demo_at_once_with_the_configmap(overlay, tmp_path):
    """With the ConfigMap's settings and a demo baked into the image (BAKE_DEMO=1), the container's first
    command is `isocompute serve` on it — not the 10-minute demo, which the startupProbe's 5 minutes would kill."""
    baked = tmp_path / "demo"
    for marker in ("policy/manifest.json", "tiny-sft/manifest.json"):
        (baked / marker).parent.mkdir(parents=True, exist_ok=True)
        (baked / marker).write_text("{}")
    conf = tmp_path / "isocompute.toml"
    conf.write_text(find(render(overlay), "ConfigMap", "isocompute-config")["data"]["isocompute.toml"])
    env = {**os.environ, "ISOCOMPUTE_CONFIG": str(conf), "ISOCOMPUTE_ENTRYPOINT_DRY_RUN": "1",
           "ISOCOMPUTE_BAKED_DEMO_DIR": str(baked)}
    env.pop("ISOCOMPUTE_DEMO_DIR", None)
    out = subprocess.run([sys.executable, str(DEPLOY.parent / "docker" / "entrypoint.py")], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"isocompute serve --policy {baked}/policy --model {baked}/tiny-sft"]


def test_the_capture_overlay_shares_one_volume_and_refits_every_replica(tmp_path):
    """The capture overlay (docs/deploy.md, "Capture and refit"): one ReadWriteMany claim mounted at the same
    path by the gateways and the refit CronJob, capture on it, the job's exit 3 a success, every replica
    reached through the headless Service, and the job's shell and Python valid."""
    objs = render("capture")
    s = Settings(**settings_of(objs))
    assert s.explore == 0.02 and str(s.capture_dir).startswith("/var/lib/isocompute/")
    pvc = find(objs, "PersistentVolumeClaim", "isocompute-shared")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    gw = find(objs, "Deployment", "isocompute-gateway")["spec"]["template"]
    job = find(objs, "CronJob", "isocompute-refit")
    jpod = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    for pod in (gw["spec"], jpod):
        claim = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
        mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"] if m["name"] in claim}
        assert list(claim.values()) == [pvc["metadata"]["name"]] and mounts == {"/var/lib/isocompute"}
        assert pod["securityContext"]["fsGroup"] == 10001
    assert job["spec"]["concurrencyPolicy"] == "Forbid" and jpod["restartPolicy"] == "Never"
    head = find(objs, "Service", "isocompute-gateway-pods")
    assert head["spec"]["clusterIP"] == "None" and head["spec"]["selector"].items() <= gw["metadata"]["labels"].items()
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in jpod["containers"][0]["env"]}
    assert env["ISOCOMPUTE_ADMIN_KEY"]["name"] == "isocompute-api-keys"
    script = jpod["containers"][0]["command"][2]
    assert "3) echo" in script and "exit 0" in script.split("3) echo", 1)[1].split("\n", 1)[0]
    assert head["metadata"]["name"] in script and "from isocompute.stages.refit import reload_gateway" in script
    for sh in (script, gw["spec"]["containers"][0]["command"][2]):
        (tmp_path / "x.sh").write_text(sh)
        assert subprocess.run(["sh", "-n", str(tmp_path / "x.sh")], capture_output=True).returncode == 0
    compile(script.split("<<'PY'", 1)[1].split("\n", 1)[1].split("\nPY\n", 1)[0], "reload", "exec")
