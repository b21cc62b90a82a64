"""Write the schemas the manifests beside this folder are checked against (tests/test_manifests.py),
from the operators' and Kubernetes' own published files, read out of local clones with git.

    python cluster/kubernetes/schemas/refresh.py --trainer CLONE --training-operator CLONE \
        --kubernetes-client CLONE

Each CLONE is a git clone holding the tag named in SOURCES below (kubeflow/training-operator was
renamed kubeflow/trainer in 2025, so one clone of kubeflow/trainer serves both). Only the schema is
kept: a CRD's openAPIV3Schema, and for NetworkPolicy the definitions it refers to in Kubernetes'
OpenAPI document, each with its `description` texts removed (documentation, not validation) and
nothing else changed. To move to a new release, change a tag here, run this, read the diff of the
JSON files, then run tests/test_manifests.py.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent

# file written -> where it comes from (the repository as GitHub names it, the tag, the path)
SOURCES = {
    "trainjob.json": (
        "kubeflow/trainer", "v2.3.0",
        "manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml",
    ),
    "clustertrainingruntime.json": (
        "kubeflow/trainer", "v2.3.0",
        "manifests/base/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml",
    ),
    "pytorchjob.json": (
        "kubeflow/training-operator", "v1.9.0",
        "manifests/base/crds/kubeflow.org_pytorchjobs.yaml",
    ),
    # Kubernetes' OpenAPI document of release-1.35 (kubernetes/kubernetes
    # api/openapi-spec/swagger.json), as the Python client of that release keeps it, unprocessed
    "networkpolicy.json": (
        "kubernetes-client/python", "v35.0.0",
        "kubernetes/swagger.json.unprocessed",
    ),
}  # fmt: skip
CLONE_OPTION = {
    "kubeflow/trainer": "trainer",
    "kubeflow/training-operator": "training_operator",
    "kubernetes-client/python": "kubernetes_client",
}
NETWORKPOLICY = "io.k8s.api.networking.v1.NetworkPolicy"


def git_show(clone: Path, tag: str, path: str) -> tuple[str, str]:
    """The file at ``tag`` and the commit the tag names."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(clone), *args], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"git {' '.join(args)} in {clone} failed: {done.stderr.strip()}")
        return done.stdout

    return git("show", f"{tag}:{path}"), git("rev-parse", f"{tag}^{{commit}}").strip()


def without_descriptions(node: object) -> object:
    """The schema with every `description` text removed, and nothing else changed. Only schema
    keywords are dropped: a property that is itself named `description` stays."""
    if isinstance(node, list):
        return [without_descriptions(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "description" and isinstance(value, str):
            continue
        if key in ("properties", "definitions"):  # names, each mapping to a schema
            out[key] = {name: without_descriptions(sub) for name, sub in value.items()}
        else:
            out[key] = without_descriptions(value)
    return out


def crd_schema(text: str) -> dict:
    """The served version's openAPIV3Schema of a CRD file, with its group, version and kind."""
    crd = yaml.safe_load(text)
    [version] = [v for v in crd["spec"]["versions"] if v.get("served") and v.get("storage")]
    return {
        "group": crd["spec"]["group"],
        "version": version["name"],
        "kind": crd["spec"]["names"]["kind"],
        "openAPIV3Schema": without_descriptions(version["schema"]["openAPIV3Schema"]),
    }


def referenced(definitions: dict, root: str) -> dict:
    """``root`` and every definition it refers to, directly or not."""
    found: dict = {}
    todo = [root]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found[name] = definitions[name]
        todo += [ref.rsplit("/", 1)[1] for ref in _refs(definitions[name])]
    return dict(sorted(found.items()))


def _refs(node: object):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for option in CLONE_OPTION.values():
        parser.add_argument("--" + option.replace("_", "-"), type=Path, required=True)
    args = parser.parse_args()
    for name, (repository, tag, path) in SOURCES.items():
        text, commit = git_show(getattr(args, CLONE_OPTION[repository]), tag, path)
        source = {"repository": repository, "tag": tag, "commit": commit, "path": path,
                  "licence": "Apache-2.0", "changed": "description texts removed"}  # fmt: skip
        if name == "networkpolicy.json":
            document = json.loads(text)
            schema = {
                "group": "networking.k8s.io", "version": "v1", "kind": "NetworkPolicy",
                "root": NETWORKPOLICY,
                "definitions": without_descriptions(
                    {"definitions": referenced(document["definitions"], NETWORKPOLICY)}
                )["definitions"],
            }  # fmt: skip
        else:
            schema = crd_schema(text)
        (HERE / name).write_text(json.dumps({"source": source, **schema}, indent=1) + "\n")
        print(f"{name}: {repository} {tag} ({commit[:12]}) {path}")


if __name__ == "__main__":
    main()
