"""The Kubernetes manifests in cluster/kubernetes/, checked as a cluster would check them before
anything runs: against the schemas the operators and Kubernetes publish (kept in
cluster/kubernetes/schemas/, whose README names their sources), applied as the API server applies
them; against the operators' admission rules; and against the Slurm script's torchrun options,
parsed by torchrun's own parser. Then the Dockerfile the manifests' image is built from.

What the schemas cannot see, these tests do not claim: a CRD's CEL rules (x-kubernetes-validations)
are evaluated here only where a test below implements them, and the others must concern a field
the manifest leaves out; rules on updates (oldSelf) do not apply to a create."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shlex
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft4Validator
from torch.distributed.run import get_args_parser

from helpers.dist.cluster import SCHEDULER_FILES, scheduler_commands

ROOT = Path(__file__).resolve().parent.parent
KUBE = ROOT / "cluster" / "kubernetes"
SCHEMAS = KUBE / "schemas"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def manifest(name: str) -> dict:
    return yaml.safe_load((KUBE / name).read_text())


def schema_file(name: str) -> dict:
    return json.loads((SCHEMAS / name).read_text())


# ------------------------------------------------------------------ the schemas, as the server
def strict(node: object, structural: bool = True) -> object:
    """A schema as the API server applies it with strict field validation (kubectl's default
    since 1.27): a field the schema does not name is an error, not silently dropped. JSON Schema
    allows unknown fields unless told otherwise, so every object schema gets additionalProperties
    false, except where x-kubernetes-preserve-unknown-fields keeps unknown fields, or the schema
    itself says what other keys may be (additionalProperties, as for labels). In a CRD's
    structural schema an object with no properties holds nothing (the server prunes it all);
    in Kubernetes' own OpenAPI document (structural=False) such an object is free-form.
    OpenAPI's `nullable` becomes JSON Schema's null type."""
    if isinstance(node, list):
        return [strict(item, structural) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in ("properties", "definitions"):
            out[key] = {name: strict(sub, structural) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not", "anyOf", "allOf", "oneOf"):
            out[key] = strict(value, structural)
        else:
            out[key] = value
    if node.get("x-kubernetes-embedded-resource"):  # apiVersion, kind, metadata implied
        out.setdefault("properties", {}).update(
            {k: {"type": "string"} for k in ("apiVersion", "kind")}, metadata={"type": "object"}
        )
    is_object = node.get("type") == "object" or "properties" in node
    keeps_unknown = node.get("x-kubernetes-preserve-unknown-fields") is True
    if is_object and not keeps_unknown and "additionalProperties" not in node:
        if "properties" in node or structural:
            out["additionalProperties"] = False
    if node.get("nullable") and isinstance(node.get("type"), str):
        out["type"] = [node["type"], "null"]
    return out


def kubernetes_definitions() -> dict:
    """Kubernetes' own definitions (NetworkPolicy and what it refers to, ObjectMeta among them),
    strict. Swagger 2 writes IntOrString as a string of format int-or-string; the server takes
    either, as OpenAPI 3's x-kubernetes-int-or-string says."""
    definitions = {
        name: strict(schema, structural=False)
        for name, schema in schema_file("networkpolicy.json")["definitions"].items()
    }
    definitions["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = {
        "anyOf": [{"type": "integer"}, {"type": "string"}]
    }
    return definitions


def crd_validator(name: str, strictly: bool = True) -> Draft4Validator:
    """A validator for one CRD's objects: its openAPIV3Schema (strict unless told otherwise),
    with the apiVersion and kind the server routes by, and the standard ObjectMeta as metadata
    (a CRD's schema leaves metadata to the server), with a name."""
    crd = schema_file(name)
    schema = copy.deepcopy(crd["openAPIV3Schema"])
    if strictly:
        schema = strict(schema)
    schema["definitions"] = kubernetes_definitions()
    schema["properties"]["apiVersion"] = {"enum": [f"{crd['group']}/{crd['version']}"]}
    schema["properties"]["kind"] = {"enum": [crd["kind"]]}
    schema["properties"]["metadata"] = {
        "allOf": [{"$ref": f"#/definitions/{OBJECT_META}"}, {"required": ["name"]}]
    }
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
    Draft4Validator.check_schema(schema)
    return Draft4Validator(schema)


def networkpolicy_validator() -> Draft4Validator:
    spec = schema_file("networkpolicy.json")
    schema = {"definitions": kubernetes_definitions(), "$ref": f"#/definitions/{spec['root']}"}
    return Draft4Validator(schema)


def problems(validator: Draft4Validator, doc: dict) -> list[str]:
    return sorted(
        f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
        for e in validator.iter_errors(doc)
    )


# The CEL rules a test evaluates (the rule's text, from the schemas, -> the same in Python).
CEL: dict[str, Callable[[object], bool]] = {
    # TrainJob
    "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')":
        lambda job: bool(DNS1035.match(job["metadata"]["name"])),
    "size(self.metadata.name) <= 63": lambda job: len(job["metadata"]["name"]) <= 63,
    # ClusterTrainingRuntime
    "[has(self.torch), has(self.mpi), has(self.jax), has(self.xgboost),has(self.flux)]"
    ".filter(x, x).size() <= 1":
        lambda policy: sum(k in policy for k in ("torch", "mpi", "jax", "xgboost", "flux")) <= 1,
    "!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder' && "
    "self.replicatedJobs.exists(x, has(x.dependsOn)))":
        lambda spec: not (
            spec.get("startupPolicy", {}).get("startupPolicyOrder") == "InOrder"
            and any("dependsOn" in job for job in spec.get("replicatedJobs", []))
        ),
}  # fmt: skip


def cel_rules(node: dict, path: tuple = ()) -> Iterator[tuple[tuple, str]]:
    """Every CEL rule in a schema with the path of the value it applies to ("[]": each item,
    "{}": each value of a map)."""
    for rule in node.get("x-kubernetes-validations", []):
        yield path, rule["rule"]
    for name, sub in node.get("properties", {}).items():
        yield from cel_rules(sub, (*path, name))
    if isinstance(node.get("items"), dict):
        yield from cel_rules(node["items"], (*path, "[]"))
    if isinstance(node.get("additionalProperties"), dict):
        yield from cel_rules(node["additionalProperties"], (*path, "{}"))


def values_at(doc: object, path: tuple) -> list:
    if not path:
        return [doc]
    head, rest = path[0], path[1:]
    if head == "[]":
        return [v for item in (doc if isinstance(doc, list) else []) for v in values_at(item, rest)]
    if head == "{}":
        items = doc.values() if isinstance(doc, dict) else []
        return [v for item in items for v in values_at(item, rest)]
    if isinstance(doc, dict) and head in doc:
        return values_at(doc[head], rest)
    return []


def cel_problems(schema_name: str, doc: dict) -> list[str]:
    """The CEL rules ``doc`` breaks, and those it reaches that no test evaluates."""
    found = []
    for path, rule in cel_rules(schema_file(schema_name)["openAPIV3Schema"]):
        values = values_at(doc, path)
        if "oldSelf" in rule or not values:
            continue  # a rule on updates, or on a field the manifest leaves out
        if rule not in CEL:
            found.append(f"{'.'.join(path)}: a CEL rule no test evaluates: {rule}")
        elif not all(CEL[rule](value) for value in values):
            found.append(f"{'.'.join(path) or '(root)'}: breaks {rule}")
    return found


# ------------------------------------------------------------ what the operators check and set
def pytorchjob_admission(job: dict) -> list[str]:
    """The Training Operator's admission webhook (pkg/webhooks/pytorch/pytorchjob_webhook.go,
    kubeflow/training-operator v1.9.0): what it refuses beyond the schema."""
    found = []
    if not DNS1035.match(job["metadata"]["name"]) or len(job["metadata"]["name"]) > 63:
        found.append("metadata.name: not a DNS-1035 label")
    specs = job["spec"].get("pytorchReplicaSpecs") or {}
    for role, spec in specs.items():
        if role not in ("Master", "Worker"):
            found.append(f"{role}: replica types are Master and Worker")
        containers = spec.get("template", {}).get("spec", {}).get("containers", [])
        if "pytorch" not in [c.get("name") for c in containers]:
            found.append(f"{role}: no container named pytorch")
        if not all(c.get("image") for c in containers):
            found.append(f"{role}: a container without an image")
        replicas = spec.get("replicas")
        if role == "Master" and replicas != 1:
            found.append("Master: replicas must be 1")
        if role != "Master" and replicas is not None and replicas < 1:
            found.append(f"{role}: replicas must be at least 1")
    if "elasticPolicy" in job["spec"]:
        if "Worker" not in specs:
            found.append("elasticPolicy: needs a Worker replica type")
        if "nProcPerNode" in job["spec"]["elasticPolicy"] and "nprocPerNode" in job["spec"]:
            found.append("elasticPolicy.nProcPerNode: not with spec.nprocPerNode")
    return found


# Trainer's reserved names (pkg/constants/constants.go, TorchRunReservedEnvNames, v2.3.0)
TORCH_RESERVED = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
                  "PET_MASTER_PORT"}  # fmt: skip
# What trainjob.yaml relies on the torch-distributed ClusterTrainingRuntime to be, as Trainer
# v2.3.0 installs it (kubeflow/trainer, manifests/base/runtimes/torch_distributed.yaml): the torch
# policy (the plugin that sets PET_*) and a replicated job "node" whose container is "node".
TORCH_DISTRIBUTED = yaml.safe_load("""
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata:
  name: torch-distributed
  labels: {trainer.kubeflow.org/framework: torch}
spec:
  mlPolicy: {numNodes: 1, torch: {}}
  template:
    spec:
      replicatedJobs:
        - name: node
          template:
            metadata:
              labels: {trainer.kubeflow.org/trainjob-ancestor-step: trainer}
            spec:
              template:
                spec:
                  containers:
                    - {name: node, image: pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime}
""")


def pod_spec(rjob: dict) -> dict:
    """The pod spec of a JobSet's replicated job (or of a patch of one)."""
    return rjob.get("template", {}).get("spec", {}).get("template", {}).get("spec", {})


def trainjob_admission(job: dict, runtime: dict) -> list[str]:
    """Trainer's admission webhook (kubeflow/trainer v2.3.0: the torch plugin's and the jobset
    plugin's Validate): what it refuses beyond the schema."""
    found = []
    env = {e["name"] for e in job["spec"].get("trainer", {}).get("env", [])}
    if env & TORCH_RESERVED:
        found.append(f"spec.trainer.env: reserved {sorted(env & TORCH_RESERVED)}")
    jobs = {
        rjob["name"]: {c["name"] for c in pod_spec(rjob)["containers"]}
        for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]
    }
    for patch in job["spec"].get("runtimePatches", []):
        domain, _, rest = patch["manager"].partition("/")
        if not (domain and rest and re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", domain)):
            found.append(f"manager {patch['manager']!r}: not a domain-prefixed path")
        spec = patch.get("trainingRuntimeSpec", {}).get("template", {}).get("spec", {})
        for rjob in spec.get("replicatedJobs", []):
            if rjob["name"] not in jobs:
                found.append(f"runtimePatches: no replicated job {rjob['name']!r} in the runtime")
                continue
            pod = pod_spec(rjob)
            for c in pod.get("containers", []) + pod.get("initContainers", []):
                if c["name"] not in jobs[rjob["name"]]:
                    found.append(f"runtimePatches: no container {c['name']!r} in the runtime")
                elif c.get("env") and c["name"] == "node":
                    found.append("runtimePatches: no env for the node container")
    return found


def operator_env(job: dict) -> dict[str, str]:
    """The PET_ variables the operator sets in the container, from the manifest, as its code
    computes them: the Training Operator's elastic.go and envvar.go (v1.9.0) for a PyTorchJob,
    Trainer's torch plugin (v2.3.0: the first pod's DNS name, and its fixed port 29500,
    constants.ContainerTrainerPort) for a TrainJob."""
    name = job["metadata"]["name"]
    if job["kind"] == "TrainJob":
        trainer = job["spec"]["trainer"]
        return {
            "PET_NNODES": str(trainer["numNodes"]),
            "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
            "PET_MASTER_ADDR": f"{name}-node-0-0.{name}",
            "PET_MASTER_PORT": "29500",
        }
    policy = job["spec"]["elasticPolicy"]
    [container] = [c for c in job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
                   ["containers"] if c["name"] == "pytorch"]  # fmt: skip
    [port] = [p["containerPort"] for p in container["ports"] if p["name"] == "pytorchjob-port"]
    env = {
        "PET_RDZV_ENDPOINT": f"{policy.get('rdzvHost', f'{name}-worker-0')}:{port}",
        "PET_RDZV_BACKEND": policy.get("rdzvBackend", "c10d"),
        "PET_NNODES": f"{policy['minReplicas']}:{policy['maxReplicas']}",
        "PET_MAX_RESTARTS": str(policy["maxRestarts"]),
        "PET_RDZV_ID": policy["rdzvId"],
    }
    if "nprocPerNode" in job["spec"]:
        env["PET_NPROC_PER_NODE"] = job["spec"]["nprocPerNode"]
    return env


def expand(word: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) in a container's arguments: replaced when the container defines VAR."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), word)


def torchrun_config(words: list[str], env: dict[str, str], monkeypatch) -> dict:
    """What torchrun runs with, read by torchrun's own parser from the command line and the
    PET_ variables in its environment (an option given on the command line wins)."""
    assert words[0] == "torchrun", words
    for key in [k for k in os.environ if k.startswith("PET_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    args = get_args_parser().parse_args(words[1:])
    nnodes = args.nnodes if ":" in args.nnodes else f"{args.nnodes}:{args.nnodes}"
    return {
        "nnodes": nnodes,
        "nproc_per_node": str(args.nproc_per_node),
        "rdzv_backend": args.rdzv_backend,
        "rdzv_port": args.rdzv_endpoint.rpartition(":")[2],
        "max_restarts": args.max_restarts,
        "module": args.module,
        "entry": args.training_script,
        "entry_args": args.training_script_args,
    }


def slurm_config(monkeypatch) -> dict:
    """The Slurm script's torchrun, with what Slurm itself sets ($SLURM_NNODES from #SBATCH)."""
    script = (ROOT / SCHEDULER_FILES["slurm"]).read_text()
    [nodes] = re.findall(r"^#SBATCH --nodes=(\d+)$", script, re.MULTILINE)
    slurm = {"SLURM_NNODES": nodes, "SLURM_JOB_ID": "1", "head_node": "node0"}
    words = [re.sub(r"\$(\w+)", lambda m: slurm[m[1]], w) for w in scheduler_commands()["slurm"]]
    return torchrun_config(words, {}, monkeypatch)


# ---------------------------------------------------------------------------------- the tests
@pytest.mark.parametrize(
    "file, schema", [("pytorchjob.yaml", "pytorchjob.json"), ("trainjob.yaml", "trainjob.json")]
)
def test_the_manifests_meet_their_crd_schemas(file, schema):
    job = manifest(file)
    assert problems(crd_validator(schema), job) == []
    assert cel_problems(schema, job) == []


def test_the_networkpolicy_meets_kubernetes_schema():
    assert problems(networkpolicy_validator(), manifest("networkpolicy.yaml")) == []


def test_the_schemas_reject_a_wrong_type_a_misspelt_field_and_a_missing_required_one():
    """The checks can fail: each of these is an error a cluster would report."""
    pytorchjob, trainjob = manifest("pytorchjob.yaml"), manifest("trainjob.yaml")
    strict_job, lax_job = crd_validator("pytorchjob.json"), crd_validator("pytorchjob.json", False)

    wrong_type = copy.deepcopy(pytorchjob)
    wrong_type["spec"]["elasticPolicy"]["maxRestarts"] = "1"  # a string, not an integer
    assert problems(strict_job, wrong_type) == [
        "spec.elasticPolicy.maxRestarts: '1' is not of type 'integer'"
    ]
    # a misspelt optional field: the server refuses it (strict) where bare JSON Schema would not
    misspelt = copy.deepcopy(pytorchjob)
    misspelt["spec"]["elasticPolicy"]["rdzvBackEnd"] = misspelt["spec"]["elasticPolicy"].pop(
        "rdzvBackend"
    )
    assert problems(lax_job, misspelt) == []
    assert [p for p in problems(strict_job, misspelt) if "rdzvBackEnd" in p] != []
    # a misspelt required field: missing, whatever the strictness
    for validator in (strict_job, lax_job):
        missing = copy.deepcopy(pytorchjob)
        missing["spec"]["pytorchReplicaSpec"] = missing["spec"].pop("pytorchReplicaSpecs")
        assert "spec: 'pytorchReplicaSpecs' is a required property" in problems(validator, missing)

    strict_train = crd_validator("trainjob.json")
    wrong_type = copy.deepcopy(trainjob)
    wrong_type["spec"]["trainer"]["numNodes"] = "2"
    assert problems(strict_train, wrong_type) == [
        "spec.trainer.numNodes: '2' is not of type 'integer'"
    ]
    missing = copy.deepcopy(trainjob)
    missing["spec"]["runtimeRef"]["nmae"] = missing["spec"]["runtimeRef"].pop("name")
    assert "spec.runtimeRef: 'name' is a required property" in problems(strict_train, missing)
    # a container field in the wrong place: the patch's container schema names only a few
    misplaced = copy.deepcopy(trainjob)
    rjob = misplaced["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    rjob["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0][
        "image"
    ] = "other:latest"
    assert any("'image' was unexpected" in p for p in problems(strict_train, misplaced))
    # the root: kind and apiVersion are the CRD's, and the name is a DNS label (a CEL rule)
    other = copy.deepcopy(trainjob)
    other["kind"], other["metadata"]["name"] = "PyTorchJob", "DDP_har"
    assert "kind: 'PyTorchJob' is not one of ['TrainJob']" in problems(strict_train, other)
    assert cel_problems("trainjob.json", other) == [
        "(root): breaks self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')"
    ]

    policy = manifest("networkpolicy.yaml")
    policy["spec"]["podSelector"]["matchLabel"] = policy["spec"]["podSelector"].pop("matchLabels")
    policy["spec"]["policyTypes"] = "Ingress"
    assert problems(networkpolicy_validator(), policy) == [
        "spec.podSelector: Additional properties are not allowed ('matchLabel' was unexpected)",
        "spec.policyTypes: 'Ingress' is not of type 'array'",
    ]


def test_every_cel_rule_the_manifests_reach_is_evaluated():
    """A refreshed schema with a new rule on a field the manifests set fails here until a test
    evaluates it."""
    job = manifest("trainjob.yaml")
    job["spec"]["managedBy"] = "trainer.kubeflow.org/trainjob-controller"
    assert cel_problems("trainjob.json", job) == [
        "spec.managedBy: a CEL rule no test evaluates: self in "
        "['trainer.kubeflow.org/trainjob-controller', 'kueue.x-k8s.io/multikueue']"
    ]


def test_the_pytorchjob_passes_the_training_operators_admission():
    job = manifest("pytorchjob.yaml")
    assert pytorchjob_admission(job) == []
    master = copy.deepcopy(job)
    master["spec"]["pytorchReplicaSpecs"]["Master"] = copy.deepcopy(
        master["spec"]["pytorchReplicaSpecs"].pop("Worker")
    )
    assert pytorchjob_admission(master) == [
        "Master: replicas must be 1", "elasticPolicy: needs a Worker replica type"
    ]  # fmt: skip


def test_the_trainjob_fits_the_torch_distributed_runtime_and_trainers_admission():
    runtime_crd = schema_file("clustertrainingruntime.json")
    assert problems(crd_validator("clustertrainingruntime.json"), TORCH_DISTRIBUTED) == []
    assert cel_problems("clustertrainingruntime.json", TORCH_DISTRIBUTED) == []
    job = manifest("trainjob.yaml")
    assert job["spec"]["runtimeRef"] == {
        "apiGroup": runtime_crd["group"],
        "kind": runtime_crd["kind"],
        "name": TORCH_DISTRIBUTED["metadata"]["name"],
    }
    assert "torch" in TORCH_DISTRIBUTED["spec"]["mlPolicy"]  # Trainer's torch plugin sets PET_*
    assert trainjob_admission(job, TORCH_DISTRIBUTED) == []
    wrong = copy.deepcopy(job)
    wrong["spec"]["trainer"]["env"].append({"name": "PET_MASTER_PORT", "value": "1"})
    patch = wrong["spec"]["runtimePatches"][0]
    patch["manager"] = "ddp-course"
    pod = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]
    pod["spec"]["template"]["spec"]["containers"][0]["name"] = "trainer"
    assert trainjob_admission(wrong, TORCH_DISTRIBUTED) == [
        "spec.trainer.env: reserved ['PET_MASTER_PORT']",
        "manager 'ddp-course': not a domain-prefixed path",
        "runtimePatches: no container 'trainer' in the runtime",
    ]


@pytest.mark.parametrize("file", ["pytorchjob.yaml", "trainjob.yaml"])
def test_torchrun_runs_as_in_the_slurm_script(file, monkeypatch):
    """The options torchrun ends up with in a pod (its arguments, with $(VAR) expanded as
    Kubernetes does, and the PET_ variables the operator sets) against the Slurm script's."""
    slurm = slurm_config(monkeypatch)
    job = manifest(file)
    env = operator_env(job)
    name = "pytorchjob" if job["kind"] == "PyTorchJob" else "trainjob"
    words = [expand(w, env) for w in scheduler_commands()[name]]
    assert not [w for w in words if "$(" in w], "a variable the operator does not set"
    ours = torchrun_config(words, env, monkeypatch)
    assert ours == slurm
    assert slurm["rdzv_backend"] == "c10d" and slurm["max_restarts"] == 1
    parsed = get_args_parser().parse_args(words[1:])
    assert parsed.rdzv_id == job["metadata"]["name"], "the job's own rendezvous"
    assert parsed.node_rank == 0 and "--node-rank" not in words, "the rendezvous ranks the nodes"
    # where the operator sets a value itself, it agrees with the command line's
    for variable, option in (("PET_NNODES", "nnodes"), ("PET_NPROC_PER_NODE", "nproc_per_node"),
                             ("PET_MAX_RESTARTS", "max_restarts"),
                             ("PET_RDZV_BACKEND", "rdzv_backend")):  # fmt: skip
        if variable in env:
            without = [w for w in words]
            i = without.index("--" + option.replace("_", "-"))
            del without[i : i + 2]
            assert torchrun_config(without, env, monkeypatch) == ours, variable


def test_the_jobs_run_the_image_the_dockerfile_builds_where_it_puts_the_course():
    dockerfile = dockerfile_instructions()
    [workdir] = [arg for op, arg in dockerfile if op == "WORKDIR"]
    pytorchjob, trainjob = manifest("pytorchjob.yaml"), manifest("trainjob.yaml")
    [container] = pytorchjob["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"][
        "containers"
    ]
    assert container["image"] == trainjob["spec"]["trainer"]["image"]
    assert container["workingDir"] == workdir
    patch = trainjob["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    [node] = patch["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"]
    for mounts in (container["volumeMounts"], node["volumeMounts"]):
        [mount] = mounts
        assert mount["mountPath"] == f"{workdir}/checkpoints"  # --checkpoint-dir checkpoints/...


def test_the_networkpolicy_admits_exactly_the_jobs_pods():
    policy = manifest("networkpolicy.yaml")["spec"]
    selected = policy["podSelector"]["matchLabels"]
    assert policy["policyTypes"] == ["Ingress"]
    [rule] = policy["ingress"]
    assert rule.get("ports") is None  # Gloo's and the workers' store's ports are the OS's choice
    assert [peer["podSelector"]["matchLabels"] for peer in rule["from"]] == [selected]
    pytorchjob, trainjob = manifest("pytorchjob.yaml"), manifest("trainjob.yaml")
    patch = trainjob["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    for labels in (
        pytorchjob["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["labels"],
        patch["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]["labels"],
    ):
        assert selected.items() <= labels.items()


# ------------------------------------------------------------------------------ the Dockerfile
def dockerfile_instructions() -> list[tuple[str, str]]:
    """(instruction, its argument) for each line of the Dockerfile, continuations joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in lines]


def dockerignored() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def test_the_dockerfile_copies_every_file_before_a_step_uses_it():
    copied: set[str] = set()  # paths in the build context the image has so far
    for op, arg in dockerfile_instructions():
        if op == "COPY":
            words = [w for w in shlex.split(arg) if not w.startswith("--")]
            for source in words[:-1]:
                assert source == "." or (ROOT / source).exists(), f"COPY of a missing {source}"
                copied.add(source)
        elif op == "RUN":
            for word in shlex.split(arg):
                word = word.strip("\"'")
                if not word.startswith("/") and word != "." and (ROOT / word).is_file():
                    assert word in copied or "." in copied, f"RUN uses {word} before COPY"
            for module in re.findall(r"python -m ([\w.]+)", arg):
                path = ROOT.joinpath(*module.split("."))
                assert path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()
                assert "." in copied, f"RUN runs {module} before the sources are copied"
    assert "." in copied


def test_the_dockerfile_installs_as_make_does_and_builds_as_the_install_test_does():
    path = ROOT / "tests" / "test_install.py"
    spec = importlib.util.spec_from_file_location("test_install", path)
    test_install = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(test_install)
    steps = dockerfile_instructions()
    runs = " ".join(arg for op, arg in steps if op == "RUN")
    makefile = (ROOT / "Makefile").read_text()
    [torch_index] = re.findall(r"^TORCH_INDEX \?= (\S+)$", makefile, re.MULTILINE)
    assert f"--index-url {torch_index} --no-deps \"$(grep -E '^torch==' requirements.txt)\"" in runs
    assert "-r /tmp/dependencies.txt -c constraints.txt" in runs
    assert shlex.join(test_install.BUILD) in runs
    [base] = [arg for op, arg in steps if op == "FROM"]
    python = re.match(r"python:(\d+\.\d+)", base)[1]
    with open(ROOT / "pyproject.toml", "rb") as f:
        requires = tomllib.load(f)["project"]["requires-python"]
    assert requires == ">=3.11" and tuple(map(int, python.split("."))) >= (3, 11)
    [user] = [arg for op, arg in steps if op == "USER"]
    assert user.isdigit() and int(user) != 0, "runAsNonRoot can check a numeric user only"
    ignored = dockerignored()
    assert {".git", ".venv", "har/*", "!har/README.md"} <= set(ignored)
