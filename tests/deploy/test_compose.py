"""docker-compose.yml and .env.example, checked without a Docker engine: the stack starts in
order, every container is health-checked, and each service is given exactly the variables
its settings class reads, which that class then accepts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from san_common.crypto import generate_key
from tests.deploy.services import (
    CONTRACT_VARIABLES,
    ROOT,
    Service,
    looks_secret,
    services,
    settings_from,
)
from tests.deploy.test_images import parse_dockerfile

COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
_URL_CREDENTIALS = re.compile(r"^\w+://(?:\$\{[^}]*\}|[^:@/]*):(?P<password>\$\{[^}]*\}|[^@]*)@")
_VARIABLE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())  # `<<` merge keys resolved
    return loaded


def env_example() -> dict[str, str]:
    pairs = (
        line.split("=", 1)
        for line in ENV_EXAMPLE.read_text().splitlines()
        if line and not line.startswith("#")
    )
    return {key.strip(): value for key, value in pairs}


def interpolate(value: str, variables: dict[str, str]) -> str:
    """Compose's `${VAR}`, `${VAR:-default}`, `${VAR-default}` and `${VAR:?error}`."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        current = variables.get(name)
        if op == ":-":
            return current or arg
        if op == "-":
            return arg if current is None else current
        if op in (":?", "?") and not current:
            raise AssertionError(f"compose requires {name}: {arg}")
        return current or ""

    return _VARIABLE.sub(one, value).replace("$$", "$")


def ours(compose: dict[str, Any]) -> dict[str, Service]:
    """Compose services built from deploy/Dockerfile, by name, with the service they run."""
    return {
        name: services()[spec["build"]["target"]]
        for name, spec in compose["services"].items()
        if "build" in spec
    }


def container_env(spec: dict[str, Any], variables: dict[str, str]) -> dict[str, str]:
    return {
        key: interpolate(str(value), variables)
        for key, value in spec.get("environment", {}).items()
    }


def seconds(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"([\d.]+)([smh])", duration))


def test_compose_runs_every_service_over_postgres_and_rabbitmq(compose: dict[str, Any]) -> None:
    assert set(ours(compose)) == set(services()), (
        "every service (and the migration) runs in compose"
    )
    assert all(name == service.name for name, service in ours(compose).items())
    defined = compose["services"]
    assert defined["postgres"]["image"].startswith("pgvector/pgvector:")
    assert "management" in defined["rabbitmq"]["image"]
    assert "127.0.0.1:${RABBITMQ_UI_PORT:-15672}:15672" in defined["rabbitmq"]["ports"]
    assert any(port.endswith(":8000") for port in defined["api"]["ports"])


def test_every_service_has_a_health_check_or_waits_for_one(compose: dict[str, Any]) -> None:
    defined = compose["services"]
    for name, spec in defined.items():
        depends = spec.get("depends_on", {})
        for dependency, rule in depends.items():
            condition = rule["condition"]
            if condition == "service_healthy":
                assert "healthcheck" in defined[dependency], (
                    f"{name} waits on {dependency}'s health"
                )
            else:
                assert condition == "service_completed_successfully", (name, dependency)
                assert defined[dependency].get("restart") == "no", f"{dependency} must be one-shot"
        if "healthcheck" not in spec:
            assert spec.get("restart") == "no" and depends, (
                f"{name}: no health check, waits on nothing"
            )
    for name, service in ours(compose).items():
        if service.name != "migrate":
            condition = defined[name]["depends_on"]["migrate"]["condition"]
            assert condition == "service_completed_successfully", (
                f"{name} starts before the migration"
            )


def test_images_are_built_from_the_dockerfile_targets(compose: dict[str, Any]) -> None:
    stages = parse_dockerfile()
    for name, service in ours(compose).items():
        build = compose["services"][name]["build"]
        assert (
            ROOT / build["context"] / build["dockerfile"]
        ).resolve() == ROOT / "deploy" / "Dockerfile"
        assert build["target"] in stages, build
        assert compose["services"][name]["image"].startswith(f"san-{service.name}:")


def test_health_checks_probe_the_port_the_service_listens_on(compose: dict[str, Any]) -> None:
    for name, service in ours(compose).items():
        spec = compose["services"][name]
        if "healthcheck" not in spec:
            continue
        env = container_env(spec, env_example())
        probe = " ".join(spec["healthcheck"]["test"])
        port = env["API_PORT"] if service.name == "api" else env["PROBE_PORT"]
        assert f"http://127.0.0.1:{port}/readyz" in probe, name
        host = env["API_HOST"] if service.name == "api" else env["PROBE_HOST"]
        assert host == "0.0.0.0", f"{name} must listen beyond the container's loopback"


def test_env_names_match_the_settings(compose: dict[str, Any]) -> None:
    for name, service in ours(compose).items():
        given = set(compose["services"][name].get("environment", {}))
        unread = given - service.env_names
        assert not unread, f"{name} is given variables it never reads: {unread}"
        missing = (service.env_used & CONTRACT_VARIABLES) - given
        assert not missing, f"{name} reads {missing}, which compose does not set"


@pytest.mark.parametrize("mode", ["development", "production"])
def test_the_settings_accept_what_compose_gives_them(
    compose: dict[str, Any], mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`.env.example` as is (a local run), and as a production `.env` with its secrets set."""
    variables = env_example()
    if mode == "production":
        variables |= {
            "SAN_ENV": "production",
            "AUTH_JWT_SECRET": "j" * 48,
            "TOKEN_ENCRYPTION_KEYS": generate_key(),
            "POSTGRES_PASSWORD": "p" * 24,
            "RABBITMQ_PASSWORD": "r" * 24,
        }
    for name, service in ours(compose).items():
        env = container_env(compose["services"][name], variables)
        settings = settings_from(service, env, tmp_path / name, monkeypatch)
        assert settings.san_env == mode
        assert settings.database_url.startswith("postgresql://")
        # an empty `${VAR:-}` must not blank out a setting whose default is not empty
        for key, value in env.items():
            field = service.settings.model_fields[key.lower()]
            if value == "" and isinstance(field.default, str):
                assert field.default == "", (
                    f"{name}: {key} is blank, its default {field.default!r} lost"
                )


def test_every_variable_is_documented_in_env_example(compose: dict[str, Any]) -> None:
    used = {m["name"] for m in _VARIABLE.finditer(COMPOSE.read_text())}
    documented = set(env_example())
    assert used == documented, f"undocumented: {used - documented}; unused: {documented - used}"


def test_no_secret_is_written_into_compose(compose: dict[str, Any]) -> None:
    assert not any(env_example()[k] for k in env_example() if looks_secret(k)), (
        ".env.example holds a secret"
    )
    for name, spec in compose["services"].items():
        for key, value in spec.get("environment", {}).items():
            if looks_secret(key):
                # a credential comes from the deployer's .env, whatever the default
                value = str(value)
                if url := _URL_CREDENTIALS.match(value):  # a URL: its password is the variable
                    value = url["password"]
                assert _VARIABLE.fullmatch(value), f"{name}: {key} is a literal"


def test_a_stop_lets_workers_finish_their_jobs(compose: dict[str, Any]) -> None:
    for name, service in ours(compose).items():
        env = container_env(compose["services"][name], env_example())
        if "WORKER_DRAIN_SECONDS" in service.env_names:
            drain = float(
                env.get(
                    "WORKER_DRAIN_SECONDS",
                    service.settings.model_fields["worker_drain_seconds"].default,
                )
            )
            assert seconds(compose["services"][name]["stop_grace_period"]) >= drain + 10, name


def test_services_sharing_generated_secrets_share_the_data_volume(compose: dict[str, Any]) -> None:
    """In a development run each process generates missing secrets into DATA_DIR: the API
    and the workers must see the same directory or their keys would differ."""
    readers = [
        name
        for name, service in ours(compose).items()
        if {"AUTH_JWT_SECRET", "TOKEN_ENCRYPTION_KEYS"} & service.env_used
    ]
    assert len(readers) >= 2
    for name in readers:
        env = container_env(compose["services"][name], env_example())
        assert f"san-data:{env['DATA_DIR']}" in compose["services"][name]["volumes"], name
