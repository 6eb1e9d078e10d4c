"""A small renderer of the kustomize subset deploy/ uses, so the tests can check what `kubectl apply -k` applies
without a kustomize binary.

Supported, with kustomize's semantics and order (resources, then components, then this kustomization's patches,
labels, images):

- ``resources``: YAML files and directories holding a kustomization;
- ``components``: directories holding a ``kind: Component``; each adds its resources and then runs its own patches,
  labels and images over everything accumulated so far;
- ``patches``: ``path`` entries only, each file a strategic-merge patch of one whole object, found by apiVersion
  group, kind, name and namespace (as kustomize requires: a patch without the namespace matches nothing). Maps merge
  and ``null`` deletes a key; lists are replaced, and patching a list that Kubernetes merges by key (containers,
  volumes, env, ports...) is refused, since that merge is not implemented here;
- ``labels``: ``pairs`` added to every object's metadata.labels (``includeSelectors``/``includeTemplates`` refused);
- ``images``: ``name`` with ``newName``/``newTag``/``digest``, on every ``containers``/``initContainers`` image;
- ``configMapGenerator``: ``name``, ``namespace``, ``envs`` (``KEY=value`` lines, ``#`` comments) and ``literals``,
  ``behavior`` create or merge. Run after resources and components, before patches; once everything is built, each
  generated ConfigMap's name gets kustomize's content hash suffix and every reference to it in its namespace
  (envFrom, env, volumes) follows, so a changed setting rolls the pods that read it.

Anything else in a kustomization is refused with ``Unsupported``, so deploy/ cannot silently use more than this.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import yaml

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SUPPORTED_FIELDS = frozenset({"apiVersion", "kind", "resources", "components", "patches", "labels", "images",
                              "configMapGenerator"})
GENERATED = "__generated__"  # marks a generated ConfigMap until build() gives it its hashed name
# Lists a strategic merge patch merges by key instead of replacing (Kubernetes' patchMergeKey fields).
MERGED_LISTS = frozenset({
    "containers", "initContainers", "ephemeralContainers", "volumes", "volumeMounts", "volumeDevices", "env",
    "ports", "imagePullSecrets", "hostAliases", "topologySpreadConstraints", "resourceClaims", "schedulingGates",
    "conditions", "finalizers", "ownerReferences",
})
CLUSTER_SCOPED = frozenset({
    "Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "PersistentVolume",
    "StorageClass", "PriorityClass", "IngressClass", "RuntimeClass", "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration", "APIService", "Node",
})


class Unsupported(Exception):
    """The kustomization uses something this renderer does not implement."""


class BuildError(Exception):
    """What kustomize itself would refuse (a missing file, a duplicate object, a patch matching nothing)."""


def load_documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def kustomization_file(directory: Path) -> Path:
    for name in KUSTOMIZATION_FILES:
        if (directory / name).is_file():
            return directory / name
    raise BuildError(f"{directory}: no kustomization file")


def object_id(obj: dict) -> tuple[str, str, str, str]:
    """(API group, kind, namespace, name); a namespaced object without a namespace is in `default`."""
    group = obj["apiVersion"].rpartition("/")[0]
    kind = obj["kind"]
    meta = obj.get("metadata") or {}
    namespace = "" if kind in CLUSTER_SCOPED else (meta.get("namespace") or "default")
    return group, kind, namespace, meta["name"]


def build(directory: Path | str) -> list[dict]:
    """The objects `kubectl kustomize <directory>` would print (in file order rather than kustomize's)."""
    objects = _accumulate(Path(directory).resolve(), [], expect_kind="Kustomization")
    _hash_generated(objects)
    seen: set[tuple] = set()
    for obj in objects:
        key = object_id(obj)
        if key in seen:
            raise BuildError(f"{directory}: {key} is defined twice")
        seen.add(key)
    return objects


def _accumulate(directory: Path, objects: list[dict], *, expect_kind: str) -> list[dict]:
    path = kustomization_file(directory)
    [k] = load_documents(path)
    kind = k.get("kind", "Kustomization")
    if kind != expect_kind:
        raise BuildError(f"{path}: a {kind} where a {expect_kind} belongs")
    unknown = set(k) - SUPPORTED_FIELDS
    if unknown:
        raise Unsupported(f"{path}: {sorted(unknown)}")

    objects = list(objects)
    for entry in k.get("resources", []):
        target = (directory / entry).resolve()
        if target.is_dir():
            objects.extend(_accumulate(target, [], expect_kind="Kustomization"))
        elif target.is_file():
            objects.extend(load_documents(target))
        else:
            raise BuildError(f"{path}: resource {entry} not found")
    for entry in k.get("components", []):
        objects = _accumulate((directory / entry).resolve(), objects, expect_kind="Component")
    for entry in k.get("configMapGenerator", []):
        _generate(objects, entry, directory=directory, source=path)
    for entry in k.get("patches", []):
        if set(entry) != {"path"}:
            raise Unsupported(f"{path}: patch {entry} (only `path`, without target or options)")
        for patch in load_documents(directory / entry["path"]):
            _apply_patch(objects, patch, source=directory / entry["path"])
    for entry in k.get("labels", []):
        if set(entry) - {"pairs"}:
            raise Unsupported(f"{path}: labels {entry} (only `pairs`)")
        for obj in objects:
            obj.setdefault("metadata", {}).setdefault("labels", {}).update(
                {str(key): str(value) for key, value in entry["pairs"].items()})
    for entry in k.get("images", []):
        if set(entry) - {"name", "newName", "newTag", "digest"}:
            raise Unsupported(f"{path}: image {entry}")
        for obj in objects:
            _set_images(obj, entry)
    return objects


def _generate(objects: list[dict], entry: dict, *, directory: Path, source: Path) -> None:
    if set(entry) - {"name", "namespace", "envs", "literals", "behavior"}:
        raise Unsupported(f"{source}: configMapGenerator {entry}")
    data: dict[str, str] = {}
    for env in entry.get("envs", []):
        for line in (directory / env).read_text().splitlines():
            line = line.lstrip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise Unsupported(f"{directory / env}: {line!r} (a value from the environment)")
            if key in data:
                raise BuildError(f"{directory / env}: {key} twice")
            data[key] = value
    for literal in entry.get("literals", []):
        key, _, value = literal.partition("=")
        data[key] = value
    namespace = entry.get("namespace") or "default"
    behavior = entry.get("behavior", "create")
    existing = [o for o in objects if o.get(GENERATED) and object_id(o) == ("", "ConfigMap", namespace, entry["name"])]
    if behavior == "merge":
        if len(existing) != 1:
            raise BuildError(f"{source}: merge into {entry['name']}, which is not generated")
        existing[0]["data"] = {**existing[0].get("data", {}), **data}
        return
    if behavior != "create":
        raise Unsupported(f"{source}: behavior {behavior}")
    objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": entry["name"],
                    "namespace": namespace}, "data": data, GENERATED: True})


def config_map_hash(data: dict[str, str]) -> str:
    """kustomize's suffix of a generated ConfigMap: its data, kind and an empty name, as Go's json.Marshal writes
    them, hashed by SHA-256; the first ten hex digits with 0, 1, 3, a, e spelt g, h, k, m, t."""
    text = json.dumps({"data": data, "kind": "ConfigMap", "name": ""}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False)
    for char, escaped in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e")):
        text = text.replace(char, escaped)
    return hashlib.sha256(text.encode()).hexdigest()[:10].translate(str.maketrans("013ae", "ghkmt"))


def _hash_generated(objects: list[dict]) -> None:
    for obj in objects:
        if not obj.pop(GENERATED, False):
            continue
        meta = obj["metadata"]
        old, namespace = meta["name"], meta.get("namespace") or "default"
        meta["name"] = f"{old}-{config_map_hash(obj.get('data', {}))}"
        for other in objects:
            if other is not obj and (other.get("metadata") or {}).get("namespace", "default") == namespace:
                _rename_refs(other, old, meta["name"])


def _rename_refs(node: Any, old: str, new: str) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("configMapRef", "configMapKeyRef", "configMap") and isinstance(value, dict) \
                    and value.get("name") == old:
                value["name"] = new
            _rename_refs(value, old, new)
    elif isinstance(node, list):
        for item in node:
            _rename_refs(item, old, new)


def _apply_patch(objects: list[dict], patch: dict, *, source: Path) -> None:
    key = object_id(patch)
    matches = [i for i, obj in enumerate(objects) if object_id(obj) == key]
    if len(matches) != 1:
        raise BuildError(f"{source}: the patch of {key} matches {len(matches)} objects")
    [i] = matches
    objects[i] = strategic_merge(objects[i], patch)


def strategic_merge(original: Any, patch: Any, *, field: str = "") -> Any:
    """The subset of a strategic merge patch described in the module docstring."""
    if isinstance(patch, dict) and isinstance(original, dict):
        if any(str(key).startswith("$") for key in patch):
            raise Unsupported(f"patch directive in {field or 'the patch'}: {sorted(patch)}")
        result = copy.deepcopy(original)
        for key, value in patch.items():
            if value is None:
                result.pop(key, None)
            elif key in result:
                result[key] = strategic_merge(result[key], value, field=key)
            else:
                result[key] = copy.deepcopy(value)
        return result
    if isinstance(patch, list) and field in MERGED_LISTS:
        raise Unsupported(f"patching the list `{field}` (merged by key in Kubernetes) is not implemented")
    return copy.deepcopy(patch)


IMAGE = re.compile(r"^(?P<name>[^@]+?)(?::(?P<tag>[^:/@]+))?(?:@(?P<digest>.+))?$")


def _set_images(node: Any, entry: dict) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                for container in value:
                    if isinstance(container, dict) and "image" in container:
                        container["image"] = _new_image(container["image"], entry)
            _set_images(value, entry)
    elif isinstance(node, list):
        for item in node:
            _set_images(item, entry)


def _new_image(image: str, entry: dict) -> str:
    m = IMAGE.match(image)
    if not m or m["name"] != entry["name"]:
        return image
    name = entry.get("newName") or m["name"]
    if entry.get("digest"):
        return f"{name}@{entry['digest']}"
    if entry.get("newTag"):
        return f"{name}:{entry['newTag']}"
    if m["digest"]:
        return f"{name}@{m['digest']}"
    return f"{name}:{m['tag']}" if m["tag"] else name
