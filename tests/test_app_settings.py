"""Gateway settings (precedence: arguments > environment > TOML config > defaults) and `isocompute serve`
argument handling."""

from __future__ import annotations

import argparse

import pytest
from pydantic import ValidationError

from isocompute.app.accounting.auth import hash_key
from isocompute.app.settings import CONFIG_ENV, Settings, get_settings
from isocompute.errors import InputError


def test_defaults_bind_to_loopback():
    s = Settings()
    assert (s.host, s.port, s.default_budget, s.budget_control) == ("127.0.0.1", 8000, 4.0, True)


def test_precedence(tmp_path, monkeypatch):
    cfg = tmp_path / "gw.toml"
    cfg.write_text('port = 9001\ndefault_budget = 2.5\nupstreams = ["http://127.0.0.1:7000"]\n')
    monkeypatch.setenv(CONFIG_ENV, str(cfg))
    assert (Settings().port, Settings().default_budget, Settings().upstreams) == (9001, 2.5, ["http://127.0.0.1:7000"])
    monkeypatch.setenv("ISOCOMPUTE_PORT", "9002")
    monkeypatch.setenv("ISOCOMPUTE_API_KEYS", f'[{{"name": "a", "sha256": "{hash_key("k")}", "max_budget": 3}}]')
    s = Settings()
    assert s.port == 9002 and s.default_budget == 2.5 and s.api_keys[0].max_budget == 3
    assert Settings(port=9003).port == 9003


def test_get_settings_is_cached(monkeypatch):
    get_settings.cache_clear()
    monkeypatch.setenv("ISOCOMPUTE_PORT", "9100")
    try:
        assert get_settings() is get_settings() and get_settings().port == 9100
    finally:
        get_settings.cache_clear()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"default_max_tokens": 4096}, "exceeds max_tokens_limit"),
        ({"default_budget": 100.0}, "exceeds max_budget"),
        ({"default_budget": -1.0}, "greater than 0"),
        ({"admin_key_sha256": "hunter2"}, "sha256 hex digest"),
        ({"engine": "tgi"}, "transformers"),
        ({"bogus": 1}, "Extra inputs are not permitted"),
    ],
)
def test_invalid_settings(kwargs, match):
    with pytest.raises(ValidationError, match=match):
        Settings(**kwargs)


def test_missing_config_file(monkeypatch, tmp_path):
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "nope.toml"))
    with pytest.raises(ValueError, match="is not a file"):
        Settings()


def serve_args(argv):
    from isocompute.cli.serve import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_serve_flags_become_settings(tmp_path):
    from isocompute.cli.serve import settings_from_args

    s = settings_from_args(serve_args(["--policy", str(tmp_path), "--upstream", "http://127.0.0.1:8001",
                                       "--upstream", "http://127.0.0.1:8002", "--port", "8123"]))
    assert s.engine == "vllm-http" and s.upstreams == ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    assert s.host == "127.0.0.1" and s.port == 8123 and s.policy_dir == tmp_path


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--engine", "vllm-http"], "needs --upstream URL"),
        (["--port", "70000"], "invalid setting port"),
        (["--config", "/nonexistent.toml"], "is not a file"),
        ([], "no policy: pass --policy DIR"),
        (["--policy", "p", "--engine", "transformers"], "needs --model DIR"),
    ],
)
def test_serve_errors(argv, match):
    from isocompute.cli.serve import run

    with pytest.raises(InputError, match=match):
        run(serve_args(argv))


def test_serve_config_env_pointing_nowhere_is_a_clear_error(monkeypatch, tmp_path):
    from isocompute.cli.serve import settings_from_args

    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "nope.toml"))
    with pytest.raises(InputError, match="ISOCOMPUTE_CONFIG=.* is not a file"):
        settings_from_args(serve_args(["--policy", str(tmp_path)]))


def test_vllm_http_sends_the_upstream_name_not_the_local_checkpoint_path(tmp_path):
    """model_dir is where this host finds tokenizer and config; vLLM knows the model by its served name
    (a path here would get 404 unless vLLM was started with exactly that path)."""
    from isocompute.app.main import build_engine

    s = Settings(engine="vllm-http", upstreams=["http://127.0.0.1:9"], model_dir=tmp_path)
    assert build_engine(s).model is None  # asked from the upstream's /v1/models
    s = Settings(engine="vllm-http", upstreams=["http://127.0.0.1:9"], model_dir=tmp_path,
                 upstream_model="Qwen/Qwen2.5-Math-1.5B-Instruct")
    assert build_engine(s).model == "Qwen/Qwen2.5-Math-1.5B-Instruct"
