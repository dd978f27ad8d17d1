"""Every manifest of ``deploy/kuberay/`` validates offline, so a misspelt field fails CI instead of a
rollout: the built-in kinds against Kubernetes' own OpenAPI schemas (``kubernetes-validate``, strict:
unknown fields refused, as ``kubectl apply --validate=strict``), the custom resources (RayService,
PodMonitor, PrometheusRule) against their CRDs' openAPIV3Schema, copied in ``deploy/kuberay/schema/``
with ``additionalProperties: false`` added where the structural schema would prune an unknown field.
Each kind of file is shown failing on a copy with one field misspelt."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.test_deploy_manifests import KUBERAY, errors, load, manifest_files, rayservice_validator, strict

__all__ = ["rayservice_validator"]  # the fixture, shared with tests/test_deploy_manifests.py


# The Kubernetes version the built-in kinds are validated against (kubernetes-validate's schemas).
KUBERNETES = "1.37"


def python_patterns(schema: Any) -> Any:
    """Go's regexp takes a flag group anywhere (``^(?i)(abort|warn)?$``); Python's only at the start."""
    if isinstance(schema, dict):
        out = {k: python_patterns(v) for k, v in schema.items()}
        if isinstance(out.get("pattern"), str) and out["pattern"].startswith("^(?i)"):
            out["pattern"] = "(?i)^" + out["pattern"][len("^(?i)") :]
        return out
    if isinstance(schema, list):
        return [python_patterns(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def crd_validators(rayservice_validator) -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    """(apiVersion, kind) -> a validator of the CRD copies in deploy/kuberay/schema/, unknown fields refused."""
    validators = {("ray.io/v1", "RayService"): rayservice_validator}
    for path in sorted((KUBERAY / "schema").glob("monitoring.coreos.com_*.yaml")):
        crd = load(path)
        for version in crd["spec"]["versions"]:
            schema = python_patterns(strict(version["schema"]["openAPIV3Schema"]))
            jsonschema.Draft7Validator.check_schema(schema)
            key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
            validators[key] = jsonschema.Draft7Validator(schema)
    return validators


def manifest_errors(path: Path, crds: dict[tuple[str, str], jsonschema.protocols.Validator]) -> list[str]:
    """Each object of a manifest file against its schema: a built-in kind against Kubernetes' own
    (kubernetes-validate, strict: unknown fields refused, as ``kubectl apply --validate=strict``), a
    custom resource against its CRD. An object with no schema is an error too: nothing goes unchecked."""
    import kubernetes_validate

    out: list[str] = []
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        where = f"{path.name}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        validator = crds.get((doc.get("apiVersion"), doc.get("kind")))
        if validator is not None:
            out += [f"{where}: {e}" for e in errors(validator, doc)]
            continue
        try:
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        except kubernetes_validate.ValidationError as e:
            out.append(f"{where}: {'/'.join(map(str, e.path))}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            out.append(f"{where}: no schema ({e.message})")
    return out


def test_every_manifest_validates_against_the_kubernetes_and_crd_schemas(crd_validators):
    """A misspelt field fails here, not in a rollout (a structural schema would prune it silently)."""
    t0 = time.monotonic()
    problems = [e for path in manifest_files() for e in manifest_errors(path, crd_validators)]
    assert problems == []
    print(f"{len(manifest_files())} manifests validated in {time.monotonic() - t0:.2f}s")


@pytest.mark.parametrize(
    ("name", "right", "wrong", "field"),
    [
        ("ui.yaml", "readinessProbe:", "readinesProbe:", "readinesProbe"),  # a Deployment's container
        ("gcs-redis.yaml", "volumeClaimTemplates:", "volumeClaimTemplate:", "volumeClaimTemplate"),
        ("archive-migrate.yaml", "restartPolicy:", "restartpolicy:", "restartpolicy"),
        ("monitoring.yaml", "podMetricsEndpoints:", "podMetricEndpoints:", "podMetricEndpoints"),  # a CRD's
        ("rayservice.yaml", "rayStartParams:", "rayStartParam:", "rayStartParam"),
    ],
)
def test_a_misspelt_field_fails_the_validation(crd_validators, tmp_path: Path, name, right, wrong, field):
    text = (KUBERAY / name).read_text()
    assert right in text
    copy_ = tmp_path / name
    copy_.write_text(text.replace(right, wrong, 1))
    problems = manifest_errors(copy_, crd_validators)
    assert problems and all(field in p for p in problems), problems


def test_a_kind_without_a_schema_is_not_skipped(crd_validators, tmp_path: Path):
    path = tmp_path / "unknown.yaml"
    path.write_text("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n")
    [problem] = manifest_errors(path, crd_validators)
    assert problem.startswith("unknown.yaml: Widget/w: no schema")
