"""A small kustomize renderer for the subset deploy/k8s uses, so the tests need no binary:
`resources` (files and directories), `patches` (strategic-merge patches by kind and name),
`images` and `namespace`. Anything else in a kustomization.yaml is refused, so a feature
added to the manifests without support here fails loudly instead of rendering wrongly.
When `kubectl` is installed, a test checks that this renders what `kubectl kustomize` does.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = frozenset({"apiVersion", "kind", "resources", "patches", "images", "namespace"})
CLUSTER_SCOPED = frozenset(
    {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
)

Manifest = dict[str, Any]


def load_documents(path: Path) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def build(directory: Path) -> list[Manifest]:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - SUPPORTED
    assert not unknown, f"{directory}: kustomize fields this renderer does not know: {unknown}"
    manifests: list[Manifest] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        manifests += build(path) if path.is_dir() else load_documents(path)
    for patch in kustomization.get("patches", []):
        assert set(patch) == {"path"}, f"only file patches are supported: {patch}"
        for document in load_documents(directory / patch["path"]):
            _apply_patch(manifests, document)
    for image in kustomization.get("images", []):
        _set_image(manifests, image)
    if namespace := kustomization.get("namespace"):
        for manifest in manifests:
            if manifest["kind"] not in CLUSTER_SCOPED:
                manifest["metadata"]["namespace"] = namespace
    return manifests


def builtin(manifest: Manifest) -> bool:
    """Kubernetes' own kinds (strategic merge); custom resources get JSON merge patches."""
    group = manifest["apiVersion"].rpartition("/")[0]
    return "." not in group or group.endswith(".k8s.io")


def _apply_patch(manifests: list[Manifest], patch: Manifest) -> None:
    key = (patch["kind"], patch["metadata"]["name"])
    targets = [m for m in manifests if (m["kind"], m["metadata"]["name"]) == key]
    assert len(targets) == 1, f"patch target {key} matches {len(targets)} resources"
    merged = _merge(targets[0], patch, by_name=builtin(targets[0]))
    targets[0].clear()
    targets[0].update(merged)


def _merge(base: Any, patch: Any, *, by_name: bool) -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            if value is None:
                merged.pop(key, None)
            elif key in merged:
                merged[key] = _merge(merged[key], value, by_name=by_name)
            else:
                merged[key] = copy.deepcopy(value)
        return merged
    if by_name and _named_list(base) and _named_list(patch):
        # strategic merge of containers, env, volumes …: items merge by their `name`
        by_key = {item["name"]: item for item in patch}
        merged_list = [
            _merge(item, by_key.pop(item["name"]), by_name=True) if item["name"] in by_key else item
            for item in base
        ]
        assert not by_key, f"patch adds list items {list(by_key)}; keep patches to existing items"
        return merged_list
    return copy.deepcopy(patch)


def _named_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(i, dict) and "name" in i for i in value)


def pod_specs(manifest: Manifest) -> Iterator[Manifest]:
    spec = manifest.get("spec", {})
    if "template" in spec:
        yield spec["template"]["spec"]
    if "jobTemplate" in spec:
        yield spec["jobTemplate"]["spec"]["template"]["spec"]


def containers(manifest: Manifest) -> Iterator[Manifest]:
    for pod in pod_specs(manifest):
        yield from pod.get("initContainers", [])
        yield from pod.get("containers", [])


def main_containers(manifest: Manifest) -> Iterator[Manifest]:
    """The containers that run the workload's service (not its init containers)."""
    for pod in pod_specs(manifest):
        yield from pod.get("containers", [])


def image_name(image: str) -> str:
    """The image reference without its tag or digest."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return name[: len(name) - len(last)] + last.split(":", 1)[0]


def _set_image(manifests: list[Manifest], rule: dict[str, str]) -> None:
    for manifest in manifests:
        for container in containers(manifest):
            if image_name(container["image"]) == rule["name"]:
                name = rule.get("newName", rule["name"])
                tag = rule.get("newTag")
                container["image"] = f"{name}:{tag}" if tag else name
