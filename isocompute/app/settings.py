"""The gateway's settings: one typed config, read once from arguments, environment and a config file.

Precedence, highest first: keyword arguments to :class:`Settings` (what ``isocompute serve`` passes),
environment variables ``ISOCOMPUTE_<FIELD>`` (upper-case field name; lists and records as JSON), the TOML
file named by ``ISOCOMPUTE_CONFIG`` (top-level keys are field names), then the defaults.
:func:`get_settings` builds them once per process (cached); tests build :class:`Settings` directly.

Every field, its ``ISOCOMPUTE_*`` variable, default and meaning are documented once, in the table of
the "Configuration" section of docs/gateway.md (``tests/test_settings_doc.py`` keeps it in step with this class).

Authentication is on exactly when at least one API key is configured (file or inline).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from isocompute.app.accounting.auth import ApiKeyRecord
from isocompute.errors import InputError

CONFIG_ENV = "ISOCOMPUTE_CONFIG"


class Settings(BaseSettings):
    """See the "Configuration" table of docs/gateway.md for every field."""

    model_config = SettingsConfigDict(env_prefix="ISOCOMPUTE_", extra="forbid", validate_default=True)

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    policy_dir: Path | None = None
    engine: Literal["transformers", "vllm-http", "vllm"] = "transformers"
    model_dir: Path | None = None
    upstreams: list[str] = Field(default_factory=list)
    upstream_model: str | None = None
    model_upstreams: dict[str, list[str]] = Field(default_factory=dict)
    model_dirs: dict[str, Path] = Field(default_factory=dict)
    action: str | None = None
    served_model: str = "isocompute"
    default_budget: float = Field(4.0, gt=0, allow_inf_nan=False)
    default_budget_unit: Literal["samples", "tokens", "flops"] = "samples"
    max_samples: int = Field(64, ge=1)
    max_waves: int = Field(32, ge=1)
    max_budget: float = Field(64.0, gt=0, allow_inf_nan=False)
    temperature: float = Field(0.7, ge=0, le=2)
    default_max_tokens: int = Field(256, ge=1)
    max_tokens_limit: int = Field(2048, ge=1)
    max_prompt_chars: int = Field(32_000, ge=1)
    max_batch_prompts: int = Field(32, ge=1)
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    max_messages: int = Field(256, ge=1)
    stream_keepalive_s: float = Field(5.0, gt=0)
    upstream_timeout_s: float = Field(120.0, gt=0)
    upstream_stall_s: float = Field(3.0, ge=0)  # 0: no stall check (engines.circuit)
    upstream_max_concurrency: int = Field(64, ge=1)  # requests (waves) in flight to one pool's upstreams
    retry_after_s: int = Field(5, ge=0)
    ready_probe_timeout_s: float = Field(30.0, gt=0)
    ready_interval_s: float = Field(5.0, gt=0)
    drain_timeout_s: float = Field(30.0, ge=0)
    max_inflight: int = Field(64, ge=1)
    queue_timeout_s: float = Field(10.0, ge=0)
    max_connections: int = Field(2048, ge=1)
    max_connections_per_client: int = Field(256, ge=1)
    header_timeout_s: float = Field(10.0, gt=0)
    body_timeout_s: float = Field(30.0, gt=0)
    tie_break: Literal["first", "seeded"] = "seeded"
    vote_file: Path | None = None
    answer_kind: str = "number"
    vote_timeout_s: float = Field(2.0, gt=0)
    grade_workers: int = Field(1, ge=1)
    prefix_caching: bool = True
    batch_requests: bool = True
    batch_max_rows: int = Field(64, ge=1)
    budget_control: bool = True
    control_gain: float = Field(0.05, gt=0, le=1)
    control_max_step: float = Field(0.5, gt=0)
    control_max_keys: int = Field(10_000, ge=1)
    control_max_keys_per_caller: int = Field(64, ge=1)
    metrics_need_admin_key: bool = False
    api_keys_file: Path | None = None
    api_keys: list[ApiKeyRecord] = Field(default_factory=list)
    admin_key_sha256: str | None = None
    quota_store: str = "memory"
    otel_traces_endpoint: str | None = None  # None: no traces (app.accounting.tracing)
    otel_service_name: str = "isocompute-gateway"
    upstream_caller_header: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9-]*$")

    @field_validator("quota_store")
    @classmethod
    def _quota_store(cls, v: str) -> str:
        if v != "memory" and not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"quota_store {v!r}: send 'memory' (one gateway) or a Redis URL shared by the "
                             "gateway's replicas, e.g. redis://127.0.0.1:6379/0")
        return v

    @field_validator("admin_key_sha256")
    @classmethod
    def _hex64(cls, v: str | None) -> str | None:
        if v is not None and (len(v) != 64 or any(c not in "0123456789abcdef" for c in v.lower())):
            raise ValueError(
                "admin_key_sha256 must be the 64-character sha256 hex digest of the admin key, "
                "e.g. `printf %s \"$KEY\" | sha256sum`; never the key itself"
            )
        return None if v is None else v.lower()

    @field_validator("answer_kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        from isocompute.tasks.answers.equivalence import kind_of

        try:
            return kind_of(v)
        except InputError as e:
            raise ValueError(str(e)) from None

    @field_validator("model_upstreams", "model_dirs")
    @classmethod
    def _model_names(cls, v: dict[str, object]) -> dict[str, object]:
        from isocompute.solver.models.actions import check_model_name

        for name, target in v.items():
            try:
                check_model_name(name)
            except InputError as e:
                raise ValueError(str(e)) from None
            if isinstance(target, list) and not target:
                raise ValueError(f"model {name!r} has an empty list of upstreams; give it one URL or more")
        return v

    @field_validator("action")
    @classmethod
    def _action(cls, v: str | None) -> str | None:
        if v is None:
            return v
        from isocompute.solver.models.actions import parse_action

        try:
            return parse_action(v).name
        except InputError as e:
            raise ValueError(str(e)) from None

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.default_max_tokens > self.max_tokens_limit:
            raise ValueError(
                f"default_max_tokens ({self.default_max_tokens}) exceeds max_tokens_limit "
                f"({self.max_tokens_limit}); lower the default or raise the limit"
            )
        if self.default_budget_unit == "samples" and self.default_budget > self.max_budget:
            raise ValueError(
                f"default_budget ({self.default_budget}) exceeds max_budget ({self.max_budget}); "
                "lower the default or raise max_budget"
            )
        if self.action is not None and self.policy_dir is not None:
            raise ValueError("give either policy_dir (a fitted policy) or action (one fixed action for every "
                             "prompt), not both")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config = os.environ.get(CONFIG_ENV)
        if config:
            if not Path(config).is_file():
                raise ValueError(f"{CONFIG_ENV}={config} is not a file; point it at a TOML config or unset it")
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=config))
        return tuple(sources)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, built once (environment and config file are read on first call)."""
    return Settings()
