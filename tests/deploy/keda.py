"""Structural schemas of the KEDA resources deploy/k8s uses (keda.sh/v1alpha1), written from
KEDA 2.x's CRDs. The Kubernetes schemas know nothing of custom resources, and the API server
silently prunes unknown fields of a structural CRD, so a misspelt field would simply vanish:
these schemas refuse it instead. Only the fields this project may use are listed."""

from __future__ import annotations

from typing import Any

_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}

RABBITMQ_METADATA: dict[str, Any] = {
    "type": "object",
    # KEDA's trigger metadata is map[string]string: a YAML number is rejected by the CRD.
    "additionalProperties": False,
    "required": ["protocol", "mode", "value", "queueName"],
    "properties": {
        "protocol": {"enum": ["auto", "http", "amqp"]},
        "mode": {"enum": ["QueueLength", "MessageRate"]},
        "value": {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"},
        "activationValue": {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"},
        "queueName": {"type": "string", "minLength": 1},
        "vhostName": {"type": "string"},
        "excludeUnacknowledged": {"enum": ["true", "false"]},
        "timeout": {"type": "string"},
    },
}

PROMETHEUS_METADATA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["serverAddress", "query", "threshold"],
    "properties": {
        "serverAddress": {"type": "string", "pattern": r"^https?://[^\s/]+(/\S*)?$"},
        "query": {"type": "string", "minLength": 1},
        "threshold": {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"},
        "activationThreshold": {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"},
        "namespace": {"type": "string"},
        "ignoreNullValues": {"enum": ["true", "false"]},
        "unsafeSsl": {"enum": ["true", "false"]},
        "timeout": {"type": "string"},
    },
}

_AUTHENTICATION_REF: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name"],
    "properties": {
        "name": {"type": "string"},
        "kind": {"enum": ["TriggerAuthentication", "ClusterTriggerAuthentication"]},
    },
}


def _trigger(kind: str, metadata: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["type", "metadata"],
        "properties": {
            "type": {"const": kind},
            "name": {"type": "string", "pattern": "^[a-z0-9-]+$"},
            "metadata": metadata,
            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
            "useCachedMetrics": {"type": "boolean"},
            "authenticationRef": _AUTHENTICATION_REF,
        },
    }


SCALED_OBJECT: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string"},
                        "kind": {"type": "string"},
                        "apiVersion": {"type": "string"},
                        "envSourceContainerName": {"type": "string"},
                    },
                },
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "idleReplicaCount": {"type": "integer", "minimum": 0},
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "initialCooldownPeriod": {"type": "integer", "minimum": 0},
                "fallback": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["failureThreshold", "replicas"],
                    "properties": {
                        "failureThreshold": {"type": "integer"},
                        "replicas": {"type": "integer"},
                    },
                },
                "advanced": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "name": {"type": "string"},
                                # an autoscaling/v2 HorizontalPodAutoscalerBehavior; the
                                # tests validate it against the Kubernetes schema
                                "behavior": {"type": "object"},
                            },
                        },
                    },
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "oneOf": [
                            _trigger("rabbitmq", RABBITMQ_METADATA),
                            _trigger("prometheus", PROMETHEUS_METADATA),
                        ]
                    },
                },
            },
        },
    },
}

TRIGGER_AUTHENTICATION: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "TriggerAuthentication"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "minProperties": 1,
            "properties": {
                "secretTargetRef": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["parameter", "name", "key"],
                        "properties": {
                            "parameter": {"type": "string"},
                            "name": {"type": "string"},
                            "key": {"type": "string"},
                        },
                    },
                },
                "env": {"type": "array"},
                "podIdentity": _STRING_MAP,
            },
        },
    },
}

SCHEMAS = {"ScaledObject": SCALED_OBJECT, "TriggerAuthentication": TRIGGER_AUTHENTICATION}
