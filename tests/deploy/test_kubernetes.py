"""deploy/k8s, rendered (base and each overlay) and checked offline: the Kubernetes schemas,
KEDA's structure, and the invariants the architecture needs."""

from __future__ import annotations

import copy
import ipaddress
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from san_common.broker.topology import Topology
from san_common.crypto import generate_key
from san_common.jobs import registry
from tests.deploy import keda
from tests.deploy.kustomize import (
    build,
    builtin,
    containers,
    image_name,
    load_documents,
    main_containers,
    pod_specs,
)
from tests.deploy.services import (
    CONTRACT_VARIABLES,
    ROOT,
    Service,
    all_console_scripts,
    looks_secret,
    service_of_script,
    services,
    settings_from,
)

K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.31"  # the oldest minor release still supported upstream
OVERLAYS = {
    "base": K8S / "base",
    "local": K8S / "overlays" / "local",
    "production": K8S / "overlays" / "production",
}
# The services that run jobs: each consumer the registry names (san_common.jobs.registry).
WORKERS = sorted({spec.consumer for spec in registry.all_specs()})
SECRET_NAME = "san-secrets"
_NUMERIC = ("_SECONDS", "_TRIES")

Manifest = dict[str, Any]


@pytest.fixture(scope="module", params=list(OVERLAYS))
def rendered(request: pytest.FixtureRequest) -> list[Manifest]:
    return build(OVERLAYS[request.param])


def of_kind(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def named(manifests: list[Manifest], kind: str, name: str) -> Manifest:
    [found] = [m for m in of_kind(manifests, kind) if m["metadata"]["name"] == name]
    return found


def ours(manifests: list[Manifest]) -> list[Manifest]:
    """SAN's workloads (not the local overlay's PostgreSQL and RabbitMQ)."""
    return [
        m
        for m in manifests
        if m["kind"] in ("Deployment", "Job")
        and m["metadata"]["labels"].get("app.kubernetes.io/part-of") == "san"
    ]


def service_of(workload: Manifest) -> Service:
    [container] = list(main_containers(workload))
    return service_of_script(container["command"][0])


def example_secret_keys() -> set[str]:
    [secret] = load_documents(K8S / "secret.example.yaml")
    return set(secret["stringData"])


def dummy_secrets() -> dict[str, str]:
    """Well-formed stand-ins for every key of the Secret, to build settings from."""
    password = "pw-" + "x" * 20
    return {
        "DATABASE_URL": f"postgresql://san:{password}@postgres:5432/san",
        "AMQP_URL": f"amqp://san:{password}@rabbitmq:5672/",
        "RABBITMQ_MANAGEMENT_URL": f"http://san:{password}@rabbitmq:15672/%2F",
        "AUTH_JWT_SECRET": "j" * 48,
        "TOKEN_ENCRYPTION_KEYS": generate_key(),
        "AI_API_KEY": "sk-" + "k" * 30,
        "GITHUB_CLIENT_SECRET": "c" * 40,
        "POSTGRES_PASSWORD": password,
        "RABBITMQ_PASSWORD": password,
    }


def container_env(manifests: list[Manifest], container: Manifest) -> dict[str, str]:
    """The environment the container starts with (secrets replaced by stand-ins)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(named(manifests, "ConfigMap", source["configMapRef"]["name"])["data"])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
        else:
            env[var["name"]] = dummy_secrets()[var["valueFrom"]["secretKeyRef"]["key"]]
    return env


# ---- schemas ---------------------------------------------------------------------------


def test_every_manifest_validates_against_the_kubernetes_schemas(rendered: list[Manifest]) -> None:
    for manifest in rendered:
        if builtin(manifest):
            kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
        else:
            jsonschema.validate(manifest, keda.SCHEMAS[manifest["kind"]])
    for scaled in of_kind(rendered, "ScaledObject"):
        behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        hpa = {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "check"},
            "spec": {
                "scaleTargetRef": {"kind": "Deployment", "name": "x"},
                "maxReplicas": 1,
                "behavior": behavior,
            },
        }
        kubernetes_validate.validate(hpa, KUBERNETES_VERSION, strict=True)


def test_the_schema_checks_do_catch_mistakes() -> None:
    manifests = build(OVERLAYS["base"])
    api = copy.deepcopy(named(manifests, "Deployment", "san-api"))
    container = api["spec"]["template"]["spec"]["containers"][0]
    container["readynessProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(api, KUBERNETES_VERSION, strict=True)
    scaled = copy.deepcopy(named(manifests, "ScaledObject", "san-ai-worker"))
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = 20  # a number, not a string
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(scaled, keda.SCALED_OBJECT)
    scaled = copy.deepcopy(named(manifests, "ScaledObject", "san-ai-worker"))
    scaled["spec"]["triggers"][0]["metadata"]["querry"] = "up"  # misspelt: KEDA would drop it
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(scaled, keda.SCALED_OBJECT)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
@pytest.mark.parametrize("overlay", ["local", "production"])
def test_the_renderer_agrees_with_kubectl_kustomize(overlay: str) -> None:
    output = subprocess.run(
        ["kubectl", "kustomize", str(OVERLAYS[overlay])],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    theirs = {_key(m): m for m in yaml.safe_load_all(output) if m}
    mine = {_key(m): m for m in build(OVERLAYS[overlay])}
    assert mine == theirs


def _key(manifest: Manifest) -> tuple[str, str]:
    return manifest["kind"], manifest["metadata"]["name"]


# ---- workloads -------------------------------------------------------------------------


def test_every_service_has_its_workload(rendered: list[Manifest]) -> None:
    deployed = {service_of(w).name: w["kind"] for w in ours(rendered)}
    expected = {name: "Job" if name == "migrate" else "Deployment" for name in services()}
    assert deployed == expected


def test_workloads_have_probes_resources_and_run_unprivileged(rendered: list[Manifest]) -> None:
    for workload in ours(rendered):
        [pod] = list(pod_specs(workload))
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["automountServiceAccountToken"] is False
        for container in pod["containers"]:
            where = f"{workload['metadata']['name']}/{container['name']}"
            assert {"requests", "limits"} <= set(container["resources"]), where
            assert {"cpu", "memory"} <= set(container["resources"]["requests"]), where
            assert "memory" in container["resources"]["limits"], where
            assert container["securityContext"]["allowPrivilegeEscalation"] is False, where
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"], where
            if workload["kind"] != "Deployment":
                continue
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            # liveness is cheap (no dependency), readiness checks the database and broker
            for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
                assert container[probe]["httpGet"]["path"] == path, where
                assert container[probe]["httpGet"]["port"] in ports, where
            env = container_env(rendered, container)
            port_setting = "API_PORT" if service_of(workload).name == "api" else "PROBE_PORT"
            assert int(env[port_setting]) in ports.values(), where
            if port_setting == "PROBE_PORT":
                assert env["PROBE_HOST"] == "0.0.0.0", where
            annotations = workload["spec"]["template"]["metadata"]["annotations"]
            assert int(annotations["prometheus.io/port"]) == int(env[port_setting]), where


def test_no_secret_values_are_committed() -> None:
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        for manifest in load_documents(path):
            if manifest.get("kind") == "Secret":
                assert path.name == "secret.example.yaml", f"{path}: a Secret is committed"
                assert not any(manifest.get("data", {}).values()), path
                assert not any(manifest.get("stringData", {}).values()), path
            if manifest.get("kind") == "ConfigMap":
                secretish = [k for k in manifest.get("data", {}) if looks_secret(k)]
                assert not secretish, f"{path}: secret-looking keys in a ConfigMap: {secretish}"
            for container in containers(manifest):
                for var in container.get("env", []):
                    if looks_secret(var["name"]):
                        assert "secretKeyRef" in var.get("valueFrom", {}), (
                            f"{path}: {var['name']} is a literal"
                        )


def test_env_names_match_the_settings_and_the_settings_accept_them(
    rendered: list[Manifest], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret_keys = example_secret_keys()
    for workload in ours(rendered):
        service = service_of(workload)
        [container] = list(main_containers(workload))
        env = container_env(rendered, container)
        unread = set(env) - service.env_names
        assert not unread, f"{service.name} is given variables it never reads: {unread}"
        missing = (service.env_used & CONTRACT_VARIABLES) - set(env)
        assert not missing, f"{service.name} reads {missing}, which the deployment does not set"
        for var in container.get("env", []):
            if ref := var.get("valueFrom", {}).get("secretKeyRef"):
                assert ref["name"] == SECRET_NAME and ref["key"] in secret_keys, var
        settings = settings_from(service, env, tmp_path, monkeypatch)
        assert settings.database_url, service.name


def test_no_deployment_starts_before_the_schema_is_current(rendered: list[Manifest]) -> None:
    """Structurally: each pod's first step is its own image's `san-migrate check --wait`,
    against the database its service uses, so it cannot start on an older schema."""
    scripts = all_console_scripts()
    assert scripts["san-migrate"] == "san-common", "every image ships san-migrate"
    for deployment in of_kind(ours(rendered), "Deployment"):
        where = deployment["metadata"]["name"]
        [pod] = list(pod_specs(deployment))
        [service] = pod["containers"]
        [wait] = pod.get("initContainers", [])
        assert wait["image"] == service["image"], f"{where}: the check knows this release's head"
        command = wait["command"]
        assert command[:2] == ["san-migrate", "check"], where
        assert int(command[command.index("--wait") + 1]) >= 60, where
        database = {v["name"]: v for v in wait["env"]}["DATABASE_URL"]
        assert database == {v["name"]: v for v in service["env"]}["DATABASE_URL"], where
        assert wait["securityContext"]["readOnlyRootFilesystem"] is True, where
        mounts = {m["name"] for m in wait.get("volumeMounts", [])}
        assert {v["name"] for v in pod["volumes"]} >= mounts, where


def test_the_migration_job_runs_san_migrate(rendered: list[Manifest]) -> None:
    [job] = [w for w in ours(rendered) if w["kind"] == "Job"]
    [container] = list(main_containers(job))
    assert container["command"] == ["san-migrate"]
    assert image_name(container["image"]).endswith("san-migrate")
    assert job["spec"]["template"]["spec"]["restartPolicy"] in ("OnFailure", "Never")
    assert 0 < job["spec"]["backoffLimit"] <= 10


# ---- scaling and disruption ------------------------------------------------------------


def test_keda_scales_each_worker_on_exactly_its_queues_runnable_work(
    rendered: list[Manifest],
) -> None:
    """Each job type's queue is a trigger of the worker that consumes it (the registry's),
    and what it reads is the queue's runnable work (san_queue_runnable_jobs), not its
    length (docs/operations.md, "Scaling on runnable work")."""
    prefix = named(rendered, "ConfigMap", "san-config")["data"]["AMQP_PREFIX"]
    topology = Topology(prefix)
    scaled_objects = {
        s["spec"]["scaleTargetRef"]["name"]: s for s in of_kind(rendered, "ScaledObject")
    }
    assert set(scaled_objects) == {f"san-{w}" for w in WORKERS}
    assert not of_kind(rendered, "TriggerAuthentication"), "the gauge needs no credentials"
    for worker in WORKERS:
        job_types = registry.job_types(worker)
        scaled = scaled_objects[f"san-{worker}"]
        deployment = named(rendered, "Deployment", f"san-{worker}")
        assert "replicas" not in deployment["spec"], "KEDA owns the replica count"
        triggers = scaled["spec"]["triggers"]
        assert {t["type"] for t in triggers} == {"prometheus"}
        queries = {t["metadata"]["query"] for t in triggers}
        assert queries == {
            f'max(san_queue_runnable_jobs{{queue="{topology.queue_name(t)}"}})' for t in job_types
        }
        assert len(triggers) == len(job_types)
        for trigger in triggers:
            assert float(trigger["metadata"]["threshold"]) > 0
            assert trigger["metadata"]["serverAddress"].startswith("http")
        spec = scaled["spec"]
        assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
        # Without the gauge (Prometheus or the maintenance service away) KEDA holds this.
        assert 1 <= spec["fallback"]["replicas"] <= spec["maxReplicaCount"]


def test_the_runnable_gauge_the_triggers_read_is_the_one_recovery_exports() -> None:
    from san_common import metrics

    assert [m.name for m in metrics.QUEUE_RUNNABLE.collect()] == ["san_queue_runnable_jobs"]


def test_disruption_budgets_cover_every_replicated_deployment(rendered: list[Manifest]) -> None:
    scaled = {s["spec"]["scaleTargetRef"]["name"] for s in of_kind(rendered, "ScaledObject")}
    budgets = of_kind(rendered, "PodDisruptionBudget")
    for deployment in of_kind(ours(rendered), "Deployment"):
        name = deployment["metadata"]["name"]
        if deployment["spec"].get("replicas", 1) < 2 and name not in scaled:
            continue
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        matching = [
            b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ]
        assert len(matching) == 1, f"{name}: {len(matching)} PodDisruptionBudgets"


def test_the_relay_runs_replicated(rendered: list[Manifest]) -> None:
    replicas = named(rendered, "Deployment", "san-relay")["spec"]["replicas"]
    local = named(rendered, "ConfigMap", "san-config")["data"]["SAN_ENV"] == "development"
    assert replicas >= (1 if local else 2)


def test_grace_periods_outlast_the_longest_job(rendered: list[Manifest]) -> None:
    for worker in WORKERS:
        deployment = named(rendered, "Deployment", f"san-{worker}")
        [container] = list(main_containers(deployment))
        env = container_env(rendered, container)
        settings = service_of(deployment).settings
        defaults = {name.upper(): f.default for name, f in settings.model_fields.items()}
        values = {
            name: float(env.get(name, default))
            for name, default in defaults.items()
            if name.endswith(_NUMERIC)
        }
        # the longest attempt is taken as one external call running into its timeout
        timeouts = [
            v
            for n, v in values.items()
            if n.startswith(("AI_", "GITHUB_")) and n.endswith("_TIMEOUT_SECONDS")
        ]
        longest_job = max(timeouts) * values["WORKER_MAX_TRIES"]
        drain = values["WORKER_DRAIN_SECONDS"]
        assert drain >= longest_job, worker
        grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        # the drain, then releasing what is left, before the kubelet's SIGKILL
        assert grace >= drain + 10, worker
    api = named(rendered, "Deployment", "san-api")
    [container] = list(main_containers(api))
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep" and int(pre_stop[1]) >= 5
    uvicorn_graceful = 20  # san_api.main: timeout_graceful_shutdown
    assert (
        api["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        > int(pre_stop[1]) + uvicorn_graceful
    )


# ---- wiring ----------------------------------------------------------------------------


def test_selectors_select_their_pods(rendered: list[Manifest]) -> None:
    templates = [
        w["spec"]["template"]["metadata"]["labels"]
        for w in rendered
        if "template" in w.get("spec", {})
    ]
    for workload in rendered:
        if "template" in workload.get("spec", {}) and "selector" in workload["spec"]:
            selector = workload["spec"]["selector"]["matchLabels"]
            assert selector.items() <= workload["spec"]["template"]["metadata"]["labels"].items()
    for service in of_kind(rendered, "Service"):
        selector = service["spec"]["selector"]
        assert any(selector.items() <= labels.items() for labels in templates), service["metadata"][
            "name"
        ]


def test_images_are_the_dockerfile_targets(rendered: list[Manifest]) -> None:
    targets = {f"san-{name}" for name in services()}
    for workload in ours(rendered):
        [container] = list(main_containers(workload))
        image = container["image"]
        name = image_name(image)
        assert name.rsplit("/", 1)[-1] in targets, image
        if "/" in name:  # pulled from a registry: a release, never a moving tag
            tag = image.removeprefix(name).removeprefix(":")
            assert tag and tag != "latest", image


# ---- network ---------------------------------------------------------------------------


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", expression
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def _port_allowed(rule: dict[str, Any], port: int) -> bool:
    return "ports" not in rule or any(p["port"] == port for p in rule["ports"])


def _policies(
    rendered: list[Manifest], labels: dict[str, str], direction: str
) -> Iterator[dict[str, Any]]:
    for policy in of_kind(rendered, "NetworkPolicy"):
        if direction in policy["spec"]["policyTypes"] and _selects(
            policy["spec"]["podSelector"], labels
        ):
            yield policy


def ingress_allowed(rendered: list[Manifest], component: str, namespace: str, port: int) -> bool:
    labels = _pod_labels(rendered, component)
    peer = {"kubernetes.io/metadata.name": namespace}
    return any(
        _port_allowed(rule, port)
        and any(_selects(p.get("namespaceSelector", {}), peer) for p in rule["from"])
        for policy in _policies(rendered, labels, "Ingress")
        for rule in policy["spec"].get("ingress", [])
    )


def egress_allowed(rendered: list[Manifest], component: str, port: int) -> bool:
    """To an arbitrary address outside the cluster's DNS pods."""
    labels = _pod_labels(rendered, component)
    return any(
        _port_allowed(rule, port) and "to" not in rule
        for policy in _policies(rendered, labels, "Egress")
        for rule in policy["spec"].get("egress", [])
    )


def _pod_labels(rendered: list[Manifest], component: str) -> dict[str, str]:
    labels: dict[str, str]
    [labels] = [
        w["spec"]["template"]["metadata"]["labels"]
        for w in ours(rendered)
        if w["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    return labels


def test_network_policy_allows_only_the_paths_the_architecture_needs(
    rendered: list[Manifest],
) -> None:
    components = [service_of(w).name for w in ours(rendered)]
    for component in components:
        labels = _pod_labels(rendered, component)
        assert any(
            {"Ingress", "Egress"} <= set(p["spec"]["policyTypes"])
            and not p["spec"].get("ingress")
            and not p["spec"].get("egress")
            for p in _policies(rendered, labels, "Ingress")
        ), f"{component}: no default-deny policy"
        metrics_port = 8000 if component == "api" else 9000
        assert ingress_allowed(rendered, component, "monitoring", metrics_port) == (
            component != "migrate"
        )
        assert not ingress_allowed(rendered, component, "default", metrics_port), component
        assert ingress_allowed(rendered, component, "ingress-nginx", 8000) == (
            component == "api"
        ), component
        assert egress_allowed(rendered, component, 5432), component
        # recovery, the maintenance service, reads the job queues' depths
        assert egress_allowed(rendered, component, 5672) == (component != "migrate"), component
        needs_https = component in ("api", "ai-worker", "github-worker")
        assert egress_allowed(rendered, component, 443) == needs_https, component
        assert not egress_allowed(rendered, component, 22), component


def test_the_api_trusts_the_ingress_for_forwarded_headers_and_only_it(
    rendered: list[Manifest],
) -> None:
    """Behind the ingress the API must believe its X-Forwarded-Proto (else the console's
    Secure cookie and the client addresses are the proxy's); only the ingress controller may
    reach the API's port, which is what makes trusting the pod network safe."""
    [api] = [w for w in ours(rendered) if service_of(w).name == "api"]
    [container] = list(main_containers(api))
    trusted = container_env(rendered, container).get("API_FORWARDED_ALLOW_IPS", "")
    networks = [ipaddress.ip_network(n.strip()) for n in trusted.split(",") if n.strip()]
    assert networks and "*" not in trusted, trusted
    assert all(n.is_private for n in networks), trusted  # never the internet
    assert any(ipaddress.ip_address("10.244.1.7") in n for n in networks)  # a pod address
    assert ingress_allowed(rendered, "api", "ingress-nginx", 8000)
    assert not ingress_allowed(rendered, "api", "default", 8000)
