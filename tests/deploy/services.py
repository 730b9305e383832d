"""What the code says about its services, found at test time rather than written down twice:
their console scripts (pyproject.toml), their settings classes and the environment
variables those read. The deployment files are checked against this."""

from __future__ import annotations

import importlib
import inspect
import re
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from pydantic import AliasChoices
from pydantic_settings import BaseSettings

from san_common.settings import ServiceSettings

ROOT = Path(__file__).resolve().parents[2]

# docs/reference/job-rules.md §8: the variables deployers rely on. A service whose settings read one
# of these must be given it by every deployment, so it can be configured without reading the code.
CONTRACT_VARIABLES = frozenset(
    {
        "DATABASE_URL",
        "AMQP_URL",
        "AUTH_JWT_SECRET",
        "AI_PROVIDER",
        "AI_BASE_URL",
        "AI_API_KEY",
        "AI_CHAT_MODEL",
        "AI_EMBEDDING_MODEL",
        "GITHUB_API_URL",
        "GITHUB_OAUTH_URL",
        "GITHUB_CLIENT_ID",
        "GITHUB_CLIENT_SECRET",
        "TOKEN_ENCRYPTION_KEYS",
        "API_HOST",
        "API_PORT",
    }
)
# Names that hold credentials: never a literal in a deployment file.
SECRET_HINTS = ("SECRET", "PASSWORD", "PASS", "TOKEN", "API_KEY", "ENCRYPTION_KEYS")
# URLs that carry credentials.
CREDENTIAL_URLS = frozenset({"DATABASE_URL", "AMQP_URL", "RABBITMQ_MANAGEMENT_URL"})


def looks_secret(name: str) -> bool:
    return name in CREDENTIAL_URLS or any(hint in name.upper() for hint in SECRET_HINTS)


@dataclass(frozen=True)
class Service:
    """A deployable process: one console script and the settings class it reads."""

    name: str  # compose service / Dockerfile target / component label
    package: str  # distribution name, for `uv sync --package`
    script: str  # console script, the container's command
    settings: type[ServiceSettings]
    sources: tuple[Path, ...]  # the code that runs in this process, besides san_common

    @property
    def env_names(self) -> frozenset[str]:
        return env_names(self.settings)

    @property
    def env_used(self) -> frozenset[str]:
        """The variables whose setting the service's own code reads (`settings.x`): a field
        inherited from ServiceSettings but never used is not here."""
        code = "\n".join(p.read_text() for source in self.sources for p in _python_files(source))
        attributes = set(re.findall(r"settings\.(\w+)", code))
        # Shared settings classes of san_common read their fields in methods the service
        # calls (`settings.runtime_config()`): their `self.x` counts as used too.
        for cls in self.settings.__mro__:
            if issubclass(cls, ServiceSettings) and cls is not ServiceSettings:
                if cls.__module__.startswith("san_common."):
                    attributes |= set(re.findall(r"self\.(\w+)", inspect.getsource(cls)))
        return frozenset(
            env for env, field in env_fields(self.settings).items() if field in attributes
        )


def _python_files(source: Path) -> list[Path]:
    return [source] if source.is_file() else sorted(source.rglob("*.py"))


def env_fields(settings: type[BaseSettings]) -> dict[str, str]:
    """Environment variable → field, for a settings class (case-insensitive, as configured)."""
    prefix = settings.model_config.get("env_prefix", "") or ""
    names: dict[str, str] = {}
    for name, field in settings.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, str):
            names[alias.upper()] = name
        elif isinstance(alias, AliasChoices):
            names.update({str(choice).upper(): name for choice in alias.choices})
        else:
            names[f"{prefix}{name}".upper()] = name
    return names


def env_names(settings: type[BaseSettings]) -> frozenset[str]:
    return frozenset(env_fields(settings))


def _settings_class(module_name: str) -> type[ServiceSettings]:
    module = importlib.import_module(f"{module_name}.settings")
    found = [
        cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, ServiceSettings) and cls.__module__ == module.__name__
    ]
    assert len(found) == 1, f"{module.__name__} should define one ServiceSettings subclass: {found}"
    return found[0]


def _scripts(pyproject: Path) -> tuple[str, dict[str, str]]:
    project = tomllib.loads(pyproject.read_text())["project"]
    return project["name"], dict(project.get("scripts", {}))


@cache
def services() -> dict[str, Service]:
    """Every package under services/ plus the migration entrypoint of libs/common."""
    found: dict[str, Service] = {}
    for pyproject in sorted((ROOT / "services").glob("*/pyproject.toml")):
        name = pyproject.parent.name
        package, scripts = _scripts(pyproject)
        script = f"san-{name}"
        assert script in scripts, f"{pyproject}: no console script {script}"
        module = scripts[script].split(":")[0].split(".")[0]
        sources = (pyproject.parent / "src",)
        found[name] = Service(name, package, script, _settings_class(module), sources)
    package, scripts = _scripts(ROOT / "libs/common/pyproject.toml")
    assert "san-migrate" in scripts
    migrate = ROOT / "libs/common/src/san_common/db/migrate.py"
    found["migrate"] = Service("migrate", package, "san-migrate", ServiceSettings, (migrate,))
    return found


def service_of_script(script: str) -> Service:
    matches = [s for s in services().values() if s.script == script]
    assert matches, f"{script!r} is no service's console script"
    return matches[0]


def all_console_scripts() -> dict[str, str]:
    """Console script → the package that installs it."""
    scripts: dict[str, str] = {}
    for pyproject in [
        ROOT / "libs/common/pyproject.toml",
        *(ROOT / "services").glob("*/pyproject.toml"),
    ]:
        package, found = _scripts(pyproject)
        scripts.update(dict.fromkeys(found, package))
    return scripts


def settings_from(
    service: Service, env: dict[str, str], data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> ServiceSettings:
    """The service's settings built from exactly `env` (this process's own environment is
    hidden), as the container would build them; raises pydantic's ValidationError when a
    value is wrong or missing. DATA_DIR is redirected: the container's path is not writable."""
    fields = env_fields(service.settings)
    for name in fields:
        monkeypatch.delenv(name, raising=False)
    values: dict[str, object] = {fields[k]: v for k, v in env.items() if k in fields}
    values["data_dir"] = data_dir
    return service.settings(**values)
