"""The container pieces that run without Docker: the entrypoint and the healthcheck, run for real, and the
structure of the Dockerfile, .dockerignore and the GPU compose file.

No Docker daemon or registry is reachable where these tests run, so the image itself is never built here:
the entrypoint is run as the image runs it (``python docker/entrypoint.py …``, ``isocompute`` on PATH);
one slow test takes the first-start path end to end (demo on an empty volume, then serve, /health and
/ready, the healthcheck script, SIGTERM).
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
ENTRYPOINT = REPO / "docker" / "entrypoint.py"
HEALTHCHECK = REPO / "docker" / "healthcheck.py"
SECRET_WORDS = ("KEY", "SECRET", "TOKEN", "PASSWORD")


# ---- Dockerfile structure ------------------------------------------------------------------------------


def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` in order: continuation lines joined, comments and blanks dropped
    (Docker drops comment lines inside a continuation too)."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        full = (buf + line).strip()
        buf = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not buf, "Dockerfile ends inside a line continuation"
    return out


def stages(instrs: list[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
    """Instructions per stage name (``FROM … AS name``), in file order; global ARGs before FROM dropped."""
    out: dict[str, list[tuple[str, str]]] = {}
    current = None
    for ins, args in instrs:
        if ins == "FROM":
            m = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", args, flags=re.IGNORECASE)
            assert m, f"every stage is named: FROM {args}"
            current = m.group(2)
            out[current] = []
        if current is not None:
            out[current].append((ins, args))
    return out


def arg_default(instrs: list[tuple[str, str]], name: str) -> str:
    for ins, args in instrs:
        if ins == "ARG" and args.split("=", 1)[0] == name:
            return args.split("=", 1)[1].strip('"')
    raise AssertionError(f"no ARG {name}=… in the Dockerfile")


@pytest.fixture(scope="module")
def dockerfile():
    return parse_dockerfile((REPO / "Dockerfile").read_text())


def test_parser_joins_continuations_and_drops_comments():
    text = "# c\nFROM a AS b\nRUN x \\\n  # inner comment\n  && y\n\nUSER u\n"
    assert parse_dockerfile(text) == [("FROM", "a AS b"), ("RUN", "x    && y"), ("USER", "u")]


def test_default_target_is_a_slim_non_root_gateway(dockerfile):
    st = stages(dockerfile)
    names = list(st)
    assert names[-1] == "runtime", "the last stage is what a plain `docker build .` produces"
    assert arg_default(dockerfile, "PYTHON_IMAGE") == "python:3.11-slim"
    assert all(args.split()[0] == "${PYTHON_IMAGE}" for ins, args in dockerfile if ins == "FROM")
    final = st["runtime"]
    users = [a for i, a in final if i == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), "the gateway runs as a non-root user"
    assert ("EXPOSE", "8000") in final
    health = [a for i, a in final if i == "HEALTHCHECK"]
    assert len(health) == 1 and "/opt/isocompute/healthcheck.py" in health[0] and "CMD" in health[0]
    assert ("ENTRYPOINT", '["python", "/opt/isocompute/entrypoint.py"]') in final
    # the two scripts ENTRYPOINT and HEALTHCHECK run are copied to where they look
    copies = [a for i, a in final if i == "COPY" and "--from" not in a]
    assert copies == ["docker/entrypoint.py docker/healthcheck.py /opt/isocompute/"]
    # build tools stay in the builder: the runtime stage copies the venv and installs only libgomp1
    runtime_runs = " ".join(a for i, a in final if i == "RUN")
    assert "build-essential" not in runtime_runs and "gcc" not in runtime_runs
    assert "pip install" not in runtime_runs
    assert ("COPY", "--from=builder /opt/venv /opt/venv") in final


def test_torch_comes_from_the_cpu_index_pinned_like_the_makefile(dockerfile):
    makefile = (REPO / "Makefile").read_text()
    pin = re.search(r"^TORCH\s*\?=\s*torch==(\S+)", makefile, flags=re.MULTILINE).group(1)
    assert arg_default(dockerfile, "TORCH_VERSION") == pin
    assert arg_default(dockerfile, "TORCH_INDEX_URL") == "https://download.pytorch.org/whl/cpu"
    runs = [a for i, a in stages(dockerfile)["builder"] if i == "RUN" and "pip install" in a]
    torch_at = next(k for k, a in enumerate(runs) if '"torch==${TORCH_VERSION}"' in a)
    assert '--index-url "${TORCH_INDEX_URL}"' in runs[torch_at]
    pkg_at = next(k for k, a in enumerate(runs) if re.search(r"pip install .*\s\.(\s|$)", a))
    assert torch_at < pkg_at, "torch first, so the package's `torch>=…` is already satisfied by the CPU build"
    assert 'echo "torch==${TORCH_VERSION}" > /tmp/torch-constraint.txt' in runs[pkg_at]
    assert "--constraint /tmp/torch-constraint.txt" in runs[pkg_at]
    # every pip install that names torch as a requirement goes to the CPU index
    installs = [c for a in runs for c in a.split("&&") if "pip install" in c]
    naming_torch = [c for c in installs if any(re.match(r'"?torch([=<>!~"]|$)', t) for t in c.split())]
    assert naming_torch and all("--index-url" in c for c in naming_torch)


def test_no_secret_is_baked_in(dockerfile):
    for ins, args in dockerfile:
        if ins not in ("ENV", "ARG"):
            continue
        for name, value in re.findall(r"(\w+)(?:=(\S*))?", args):
            if any(w in name.upper() for w in SECRET_WORDS):
                assert not value, f"{ins} {name} carries a value; pass secrets at run time"


def test_copy_sources_exist_and_are_not_ignored(dockerfile):
    patterns = dockerignore_patterns()
    sources = []
    for ins, args in dockerfile:
        if ins in ("COPY", "ADD") and "--from" not in args:
            sources += args.split()[:-1]
    assert {"pyproject.toml", "README.md", "isocompute", "docker/entrypoint.py"} <= set(sources)
    for src in sources:
        assert (REPO / src).exists(), f"COPY {src}: no such path in the repo"
        assert not ignored(src, patterns), f"COPY {src} is excluded by .dockerignore"
    # the package's own files reach the build (pyproject names README.md as its readme)
    assert not ignored("isocompute/cli/serve.py", patterns)


def dockerignore_patterns() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule for the cases used here: a pattern matches a path or any of its parent directories;
    ``**/`` matches zero or more directories; a later ``!pattern`` re-includes."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for p in patterns:
        negate, pat = p.startswith("!"), p.lstrip("!")
        variants = {pat, pat[3:]} if pat.startswith("**/") else {pat}
        if any(fnmatch.fnmatchcase(x, v) for x in prefixes for v in variants):
            result = not negate
    return result


@pytest.mark.parametrize("path", [".venv", ".venv/bin/python", ".venv-vllm", "runs", "runs/demo/policy",
                                  ".git", ".git/HEAD", "isocompute/__pycache__/x.pyc", "isocompute.egg-info"])
def test_dockerignore_keeps_environments_runs_and_history_out(path):
    assert ignored(path, dockerignore_patterns())


def test_ignore_matcher_hand_cases():
    assert ignored("a/b/c", ["a"]) and not ignored("ab", ["a"])
    assert ignored("__pycache__", ["**/__pycache__"]) and ignored("x/y/__pycache__/z", ["**/__pycache__"])
    assert not ignored("a/keep", ["a", "!a/keep"])


# ---- the GPU compose file ------------------------------------------------------------------------------


def test_gpu_compose_wires_the_gateway_to_vllm():
    c = yaml.safe_load((REPO / "docker" / "compose.gpu.yaml").read_text())
    s = c["services"]
    assert set(s) == {"demo", "vllm", "gateway"}
    for name in ("demo", "gateway"):
        assert s[name]["image"] == "isocompute"
        assert (REPO / "docker" / s[name]["build"]["context"] / s[name]["build"]["dockerfile"]).is_file()
    demo_out = s["demo"]["command"][s["demo"]["command"].index("--out") + 1]
    vllm_args = s["vllm"]["command"]
    vllm_port = vllm_args[vllm_args.index("--port") + 1]
    assert vllm_args[vllm_args.index("--model") + 1] == f"{demo_out}/tiny-sft"
    assert s["vllm"]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    env = s["gateway"]["environment"]
    assert env["ISOCOMPUTE_ENGINE"] == "vllm-http"
    assert yaml.safe_load(env["ISOCOMPUTE_UPSTREAMS"]) == [f"http://vllm:{vllm_port}"]
    assert env["ISOCOMPUTE_POLICY_DIR"] == f"{demo_out}/policy"
    assert env["ISOCOMPUTE_MODEL_DIR"] == f"{demo_out}/tiny-sft"
    assert s["gateway"]["depends_on"]["vllm"]["condition"] == "service_healthy"
    assert s["vllm"]["depends_on"]["demo"]["condition"] == "service_completed_successfully"
    assert s["gateway"]["ports"] == ["8000:8000"]
    # every variable is a real setting: unknown ISOCOMPUTE_* variables are ignored, so a typo would pass
    from isocompute.app.settings import Settings

    fields = {f"ISOCOMPUTE_{f.upper()}" for f in Settings.model_fields}
    assert set(env) <= fields
    assert not [k for k in env if any(w in k for w in SECRET_WORDS)]


# ---- the entrypoint, run for real ----------------------------------------------------------------------


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without ISOCOMPUTE_* (a developer's own settings must not leak in), with
    this venv first on PATH as the image's is."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ISOCOMPUTE_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["ISOCOMPUTE_BAKED_DEMO_DIR"] = "/nonexistent/baked"
    env.update(extra)
    return env


def entrypoint(args: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ENTRYPOINT), *args], env=clean_env(**env), capture_output=True,
                          text=True, timeout=60)


def dry_run(args: list[str], **env: str) -> list[list[str]]:
    r = entrypoint(args, ISOCOMPUTE_ENTRYPOINT_DRY_RUN="1", **env)
    assert r.returncode == 0, r.stderr
    return [shlex.split(line) for line in r.stdout.splitlines()]


def fake_demo(d: Path, complete: bool = True) -> Path:
    """A demo directory as the entrypoint sees it: only the two stage markers it checks."""
    if complete:
        for m in ("policy/manifest.json", "tiny-sft/manifest.json"):
            (d / m).parent.mkdir(parents=True, exist_ok=True)
            (d / m).write_text("{}")
    return d


def test_embedded_default_fills_policy_model_and_host(tmp_path):
    d = fake_demo(tmp_path)
    assert dry_run([], ISOCOMPUTE_DEMO_DIR=str(d)) == [
        ["isocompute", "serve", "--policy", f"{d}/policy", "--model", f"{d}/tiny-sft", "--host", "0.0.0.0"]]


def test_missing_demo_is_run_first_with_extra_args(tmp_path):
    d = fake_demo(tmp_path / "empty", complete=False)
    demo, serve = dry_run([], ISOCOMPUTE_DEMO_DIR=str(d), ISOCOMPUTE_DEMO_ARGS="--prompts 20 --n 2")
    assert demo == ["isocompute", "demo", "--out", str(d), "--prompts", "20", "--n", "2"]
    assert serve[:4] == ["isocompute", "serve", "--policy", f"{d}/policy"]


def test_half_written_demo_counts_as_missing(tmp_path):
    d = fake_demo(tmp_path)
    (d / "policy" / "manifest.json").unlink()
    assert dry_run([], ISOCOMPUTE_DEMO_DIR=str(d))[0][:2] == ["isocompute", "demo"]


def test_environment_settings_are_left_to_serve(tmp_path):
    """Flags would override the environment, so the entrypoint adds none for what it sets — and runs no
    demo, though the demo directory is empty."""
    d = fake_demo(tmp_path, complete=False)
    assert dry_run([], ISOCOMPUTE_DEMO_DIR=str(d), ISOCOMPUTE_POLICY_DIR="/m/policy",
                   ISOCOMPUTE_MODEL_DIR="/m/ckpt", ISOCOMPUTE_HOST="10.0.0.5") == [["isocompute", "serve"]]


def test_config_file_settings_are_left_to_serve(tmp_path):
    d = fake_demo(tmp_path / "d", complete=False)
    cfg = tmp_path / "gw.toml"
    cfg.write_text('policy_dir = "/m/policy"\nmodel_dir = "/m/ckpt"\nhost = "0.0.0.0"\n')
    assert dry_run([], ISOCOMPUTE_DEMO_DIR=str(d), ISOCOMPUTE_CONFIG=str(cfg)) == [["isocompute", "serve"]]
    # --config as a flag is read the same way, and stays on serve's command line
    assert dry_run(["--config", str(cfg)], ISOCOMPUTE_DEMO_DIR=str(d)) == [
        ["isocompute", "serve", "--config", str(cfg)]]


def test_user_flags_come_last_and_suppress_the_demo(tmp_path):
    d = fake_demo(tmp_path, complete=False)
    assert dry_run(["--policy", "/m/p", "--model", "/m/c", "--port", "9000"], ISOCOMPUTE_DEMO_DIR=str(d)) == [
        ["isocompute", "serve", "--host", "0.0.0.0", "--policy", "/m/p", "--model", "/m/c", "--port", "9000"]]


def test_upstream_without_policy_serves_the_demo_through_vllm(tmp_path):
    d = fake_demo(tmp_path)
    assert dry_run(["--upstream", "http://vllm:8000"], ISOCOMPUTE_DEMO_DIR=str(d)) == [
        ["isocompute", "serve", "--policy", f"{d}/policy", "--model", f"{d}/tiny-sft", "--host", "0.0.0.0",
         "--upstream", "http://vllm:8000"]]


def test_a_complete_baked_demo_is_preferred_over_the_volume(tmp_path):
    baked = fake_demo(tmp_path / "baked")
    [serve] = dry_run([], ISOCOMPUTE_BAKED_DEMO_DIR=str(baked))
    assert serve[2:4] == ["--policy", f"{baked}/policy"]
    incomplete = fake_demo(tmp_path / "half", complete=False)
    demo, serve = dry_run([], ISOCOMPUTE_BAKED_DEMO_DIR=str(incomplete))
    assert demo[:4] == ["isocompute", "demo", "--out", "/data/demo"]


@pytest.mark.parametrize("args, env, match", [
    (["--engine", "vllm-http"], {}, "needs --upstream URL"),
    ([], {"ISOCOMPUTE_PORT": "99999"}, "invalid setting port"),
    ([], {"ISOCOMPUTE_CONFIG": "/nonexistent.toml"}, "is not a file"),
])
def test_bad_settings_fail_before_any_demo(tmp_path, args, env, match):
    r = entrypoint(args, ISOCOMPUTE_DEMO_DIR=str(tmp_path), **env)
    assert r.returncode == 2 and re.search(match, r.stderr), r.stderr
    assert not any(tmp_path.iterdir()), "nothing was run"


def test_a_command_runs_instead_of_serve():
    r = entrypoint(["python", "-c", "import os; print('ran', os.getpid())"])
    assert r.returncode == 0 and r.stdout.startswith("ran ")


@pytest.mark.serial  # it bounds in seconds how soon SIGTERM stops the demo
def test_docker_stop_during_the_demo_stops_it_at_once(tmp_path):
    """SIGTERM to the entrypoint (PID 1 in the container) reaches the demo it runs; the exit status is the
    shell's 128 + 15 and the message says the next start resumes."""
    proc = subprocess.Popen([sys.executable, str(ENTRYPOINT)], env=clean_env(ISOCOMPUTE_DEMO_DIR=str(tmp_path)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("[demo] sample"):  # the first stage that runs a while (train sft copies a checkpoint)
                break
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 128 + signal.SIGTERM
        assert time.monotonic() - t0 < 10, "SIGTERM did not stop the demo"
        assert "the next start resumes it" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert not (tmp_path / "solution" / "manifest.json").exists()
    time.sleep(1)  # the sample shards the demo started were stopped with it
    assert not [p for p in Path("/proc").glob("[0-9]*") if _is_shard_of(p, tmp_path)]


def _is_shard_of(proc_dir: Path, demo_dir: Path) -> bool:
    try:
        return str(demo_dir).encode() in (proc_dir / "cmdline").read_bytes() and b"--shard" in (proc_dir / "cmdline").read_bytes()
    except OSError:
        return False


# ---- healthcheck ---------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthcheck(**env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HEALTHCHECK)], env=clean_env(**env), capture_output=True,
                          text=True, timeout=30)


def test_healthcheck_fails_when_nothing_listens():
    port = free_port()
    r = healthcheck(ISOCOMPUTE_PORT=str(port))
    assert r.returncode == 1 and f"127.0.0.1:{port}/health" in r.stderr


def test_healthcheck_port_order():
    import importlib.util

    spec = importlib.util.spec_from_file_location("healthcheck", HEALTHCHECK)
    hc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hc)
    assert hc.port({}) == 8000
    assert hc.port({"ISOCOMPUTE_PORT": "9001"}) == 9001


@pytest.mark.slow
def test_first_start_runs_the_demo_then_serves(tmp_path):
    """An empty volume: the entrypoint runs a (shortened) demo, then becomes `isocompute serve` on its
    artifacts; /health and /ready answer, the healthcheck passes (port from the env and from a TOML
    config), SIGTERM stops it, and a second start finds the demo done."""
    d = tmp_path / "data" / "demo"
    port = free_port()
    env = clean_env(ISOCOMPUTE_DEMO_DIR=str(d), ISOCOMPUTE_HOST="127.0.0.1", ISOCOMPUTE_PORT=str(port),
                    ISOCOMPUTE_DEMO_ARGS="--prompts 20 --n 2 --actions 1,2 --budget 1.5")
    log = tmp_path / "entrypoint.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, str(ENTRYPOINT)], env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, f"entrypoint exited {proc.returncode}:\n{log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"{url}/ready", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"not ready after 300 s:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
        out = log.read_text()
        assert "running `isocompute demo --out" in out and "[demo] all stages done" in out
        assert "copied the embedded checkpoint" in out
        assert f"entrypoint: isocompute serve --policy {d}/policy --model {d}/tiny-sft" in out
        # exec'd: the process we started is now serve itself (signals reach uvicorn directly)
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert b"serve" in cmdline and not any(b"entrypoint.py" in a for a in cmdline)

        assert healthcheck(ISOCOMPUTE_PORT=str(port)).returncode == 0
        cfg = tmp_path / "gw.toml"
        cfg.write_text(f"port = {port}\n")
        assert healthcheck(ISOCOMPUTE_CONFIG=str(cfg)).returncode == 0

        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal so the exit status tells why it stopped
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
        assert "Finished server process" in log.read_text()
        assert healthcheck(ISOCOMPUTE_PORT=str(port)).returncode == 1
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert dry_run([], ISOCOMPUTE_DEMO_DIR=str(d)) == [
        ["isocompute", "serve", "--policy", f"{d}/policy", "--model", f"{d}/tiny-sft", "--host", "0.0.0.0"]]
