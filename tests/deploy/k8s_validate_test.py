#!/usr/bin/env python3
"""The Kubernetes example (deploy/k8s/*.yaml) validated offline, not applied: the core kinds
(Namespace, DaemonSet, Deployment, Service, ConfigMap) against the Kubernetes schemas bundled in
PyPI's kubernetes-validate (pinned, strict: an unknown field fails), and the InferencePool against
the openAPIV3Schema of its CRD kept in deploy/k8s/crds/ (from gateway-api-inference-extension),
with jsonschema. Then what ties them together: the pool selects the workers' pod labels, targets
their container port, and the workers mount the socket directory expertd's DaemonSet uses.

A document of a kind with neither schema fails. Exits 77 (ctest SKIP) only when the validator
cannot be installed here.

Usage: k8s_validate_test.py --bin BUILD_DIR --source SOURCE_DIR
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--bin", required=True)
ap.add_argument("--source", required=True)
args = ap.parse_args()

VALIDATOR = "kubernetes-validate==1.37.0"
K8S_VERSION = "1.33.0"
VENV = os.path.join(os.path.abspath(args.bin), "k8s-venv-kubernetes-validate1.37.0")
SKIP = 77

if os.path.realpath(sys.prefix) != os.path.realpath(VENV):
    py = os.path.join(VENV, "bin", "python")
    if not os.path.exists(os.path.join(VENV, ".ready")):
        shutil.rmtree(VENV, ignore_errors=True)
        try:
            subprocess.run([sys.executable, "-m", "venv", VENV], check=True, capture_output=True, text=True)
            subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", VALIDATOR],
                           check=True, capture_output=True, text=True, timeout=600)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            print(f"SKIP: cannot install {VALIDATOR}: {e}\n{(getattr(e, 'stderr', '') or '')[-2000:]}")
            shutil.rmtree(VENV, ignore_errors=True)
            sys.exit(SKIP)
        open(os.path.join(VENV, ".ready"), "w").close()
    os.execv(py, [py] + sys.argv)

import jsonschema  # noqa: E402  (kubernetes-validate's dependency)
import kubernetes_validate  # noqa: E402
import yaml  # noqa: E402

failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)


K8S = os.path.join(os.path.abspath(args.source), "deploy", "k8s")
crd_schemas = {}  # (apiVersion, kind) -> openAPIV3Schema
for path in glob.glob(os.path.join(K8S, "crds", "*.yaml")):
    crd = yaml.safe_load(open(path))
    for v in crd["spec"]["versions"]:
        crd_schemas[(f"{crd['spec']['group']}/{v['name']}", crd["spec"]["names"]["kind"])] = \
            v["schema"]["openAPIV3Schema"]
check(("inference.networking.k8s.io/v1", "InferencePool") in crd_schemas, "the InferencePool CRD's schema is here")

docs = []
for path in sorted(glob.glob(os.path.join(K8S, "*.yaml"))):
    docs += [(os.path.basename(path), d) for d in yaml.safe_load_all(open(path)) if d]
check(len(docs) >= 6, f"{len(docs)} documents in deploy/k8s/*.yaml")


def strict(schema):
    """A CRD schema as JSON Schema that rejects unknown fields, as the API server prunes them."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
        if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


by_kind = {}
for name, d in docs:
    what = f"{name}: {d.get('kind')} {d.get('metadata', {}).get('name')}"
    key = (d.get("apiVersion"), d.get("kind"))
    by_kind.setdefault(d.get("kind"), []).append(d)
    if key in crd_schemas:
        schema = strict(crd_schemas[key])
        schema["properties"]["metadata"] = {"type": "object"}
        errors = [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(d)]
        check(not errors, f"{what} valid against its CRD's schema {errors[:3]}")
        continue
    try:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
        check(True, f"{what} valid against Kubernetes {K8S_VERSION}'s schema (strict)")
    except kubernetes_validate.utils.SchemaNotFoundError as e:
        check(False, f"{what}: no schema for it ({e})")
    except kubernetes_validate.ValidationError as e:
        check(False, f"{what}: {e.message} at {list(e.path)}")

# The checks prove something: a typo in a field and a wrong type are caught.
bad = yaml.safe_load(yaml.safe_dump(by_kind["Deployment"][0]))
bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
try:
    kubernetes_validate.validate(bad, K8S_VERSION, strict=True)
    check(False, "a misspelt Deployment field is rejected")
except kubernetes_validate.ValidationError:
    check(True, "a misspelt Deployment field is rejected")
pool_schema = strict(crd_schemas[("inference.networking.k8s.io/v1", "InferencePool")])
bad = yaml.safe_load(yaml.safe_dump(by_kind["InferencePool"][0]))
bad["spec"]["targetPorts"] = [{"number": "8000"}]
check(any(True for _ in jsonschema.Draft7Validator(pool_schema).iter_errors(bad)),
      "an InferencePool with a port as a string is rejected")

# What ties them together.
pool = by_kind["InferencePool"][0]["spec"]
deploy = by_kind["Deployment"][0]["spec"]
pod_labels = deploy["template"]["metadata"]["labels"]
check(all(pod_labels.get(k) == v for k, v in pool["selector"]["matchLabels"].items()),
      "the InferencePool selects the workers' pods")
ports = [p["containerPort"] for c in deploy["template"]["spec"]["containers"] for p in c.get("ports", [])]
check([p["number"] for p in pool["targetPorts"]] == ports, f"the pool targets the workers' port ({ports})")
conf = by_kind["ConfigMap"][0]["data"]["expert-serve.conf"]
check(f"port = {ports[0]}" in conf, "the workers' config listens on that port")


def host_paths(spec):
    return {v["hostPath"]["path"] for v in spec["template"]["spec"]["volumes"] if "hostPath" in v}


check("/run/expertd" in host_paths(deploy) & host_paths(by_kind["DaemonSet"][0]["spec"]),
      "the workers mount the socket directory of the node's expertd")
grace = deploy["template"]["spec"]["terminationGracePeriodSeconds"]
check(grace > 30 and "drain-timeout-s = 30" in conf, f"the pods' grace period ({grace}s) outlasts the drain (30s)")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("k8s_validate_test: all checks passed")
