"""deploy/kubernetes, validated offline: the core kinds against the Kubernetes API schemas (kubernetes-validate),
the InferencePool and HTTPRoute against their CRDs' schemas and the endpoint picker's config against its
documented shape (vendored in tests/deploy/schemas), every `vriksha` command line against vriksha's own parser,
and the references between the objects (selectors, ports, names) against each other."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from vriksha.cli import build_parser
from vriksha.server.config import ServerConfig
from vriksha.server.kv_roles import KVRoleConfig

kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"
SCHEMAS = Path(__file__).parent / "schemas"
K8S_VERSION = "1.33.0"


def _crd_schemas() -> dict[tuple[str, str], dict]:
    out = {}
    for path in SCHEMAS.glob("*.v1.json"):
        d = json.loads(path.read_text())
        out[(f"{d['group']}/{d['version']}", d["kind"])] = d["schema"]
    return out


CRDS = _crd_schemas()


def documents() -> list[tuple[str, dict]]:
    docs = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((path.name, doc))
    return docs


DOCS = documents()


def by_kind(kind: str, name: str | None = None) -> list[dict]:
    return [d for _, d in DOCS if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def validate(doc: dict) -> None:
    schema = CRDS.get((doc["apiVersion"], doc["kind"]))
    if schema is not None:
        jsonschema.Draft7Validator(schema).validate(doc)
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    ("name", "doc"), DOCS, ids=[f"{f}:{d['kind']}/{d['metadata']['name']}" for f, d in DOCS]
)
def test_every_object_matches_its_schema(name, doc):
    validate(doc)


def test_the_validators_refuse_what_is_wrong():
    pool = copy.deepcopy(by_kind("InferencePool")[0])
    del pool["spec"]["targetPorts"]
    with pytest.raises(jsonschema.ValidationError, match="targetPorts"):
        validate(pool)
    sts = copy.deepcopy(by_kind("StatefulSet", "vriksha-replica")[0])
    sts["spec"]["template"]["spec"]["containers"][0]["port"] = 8000  # a misspelt field
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(sts)


def test_kustomization_lists_files_that_exist():
    kust = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    assert kust["resources"] and all((MANIFESTS / r).is_file() for r in kust["resources"])


def _vriksha_args(workload: dict) -> list[list[str]]:
    out = []
    for c in workload["spec"]["template"]["spec"]["containers"]:
        if c.get("args", [None])[0] == "vriksha":
            out.append([a.replace("$(POD_IP)", "10.0.0.7") for a in c["args"][1:]])
    return out


def test_every_vriksha_command_line_parses_with_vriksha():
    parser = build_parser()
    seen = set()
    for _, doc in DOCS:
        if doc["kind"] in ("Deployment", "StatefulSet"):
            for argv in _vriksha_args(doc):
                args = parser.parse_args(argv)  # an unknown flag or a bad value exits here
                seen.add(argv[0])
                if argv[0] == "serve":
                    assert ServerConfig.from_args(args).host == "0.0.0.0"  # reachable from other pods
    assert seen == {"serve", "router"}


def test_roles_and_labels_follow_the_serve_flags():
    for sts in by_kind("StatefulSet"):
        labels = sts["spec"]["template"]["metadata"]["labels"]
        (argv,) = _vriksha_args(sts)
        args = build_parser().parse_args(argv)
        assert labels["llm-d.ai/role"] == KVRoleConfig.from_args(args).role


def test_pool_picker_route_and_router_point_at_each_other():
    (pool,) = by_kind("InferencePool")
    selected = [
        s for s in by_kind("StatefulSet")
        if pool["spec"]["selector"]["matchLabels"].items() <= s["spec"]["template"]["metadata"]["labels"].items()
    ]  # fmt: skip
    assert [s["metadata"]["name"] for s in selected] == ["vriksha-replica"]
    (argv,) = _vriksha_args(selected[0])
    port = ServerConfig.from_args(build_parser().parse_args(argv)).port
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [port]
    epp = pool["spec"]["endpointPickerRef"]
    (svc,) = by_kind("Service", epp["name"])
    assert epp["port"]["number"] in [p["port"] for p in svc["spec"]["ports"]]
    (deploy,) = by_kind("Deployment", "vriksha-epp")
    assert svc["spec"]["selector"].items() <= deploy["spec"]["template"]["metadata"]["labels"].items()
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--pool-name") + 1] == pool["metadata"]["name"]
    (route,) = by_kind("HTTPRoute")
    assert route["spec"]["rules"][0]["backendRefs"][0]["name"] == pool["metadata"]["name"]
    # the router names every replica the StatefulSet makes, at its stable DNS name and ports
    sts = selected[0]
    (router,) = by_kind("Deployment", "vriksha-router")
    (rargv,) = _vriksha_args(router)
    replicas = build_parser().parse_args(rargv).replica
    want = [
        f"http://{sts['metadata']['name']}-{i}.{sts['spec']['serviceName']}:8000,"
        f"tcp://{sts['metadata']['name']}-{i}.{sts['spec']['serviceName']}:5557"
        for i in range(sts["spec"]["replicas"])
    ]
    assert replicas == want
    assert by_kind("Service", sts["spec"]["serviceName"])[0]["spec"]["clusterIP"] == "None"


def test_endpoint_picker_config_is_complete():
    (cm,) = by_kind("ConfigMap", "vriksha-epp-config")
    cfg = yaml.safe_load(cm["data"]["epp.yaml"])
    jsonschema.validate(cfg, json.loads((SCHEMAS / "endpointpickerconfig.json").read_text()))
    names = {p.get("name", p["type"]) for p in cfg["plugins"]}
    refs = {r["pluginRef"] for prof in cfg["schedulingProfiles"] for r in prof["plugins"]}
    assert refs <= names
    types = {p["type"] for p in cfg["plugins"]}
    # the scorers that read the replicas' vLLM-named metrics, a picker and a profile handler
    assert {
        "queue-scorer",
        "kv-cache-utilization-scorer",
        "max-score-picker",
        "single-profile-handler",
    } <= types
    (deploy,) = by_kind("Deployment", "vriksha-epp")
    spec = deploy["spec"]["template"]["spec"]
    args = spec["containers"][0]["args"]
    mount = spec["containers"][0]["volumeMounts"][0]["mountPath"]
    assert args[args.index("--config-file") + 1] == f"{mount}/epp.yaml"
    assert spec["volumes"][0]["configMap"]["name"] == cm["metadata"]["name"]
