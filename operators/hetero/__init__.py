"""The HeteroTrainingJob operator: one resource for a heterogeneous, elastic training job.

Layers, outermost first::

    handlers.py   kopf handlers: parse, call a pure function, apply the result (thin)
    kube.py       writes to the Kubernetes API through the official ``kubernetes`` client
    notify.py     node events to the run's controller, metrics read back from it (urllib)
    reconcile.py  pure: desired pool replicas from Node capacity, status from controller metrics
    nodes.py      pure: a Node (and its previous state) -> zero or one node event
    render.py     pure: a job spec -> RayCluster, RayJob and job ConfigMap manifests
    spec.py       the custom resource's spec, validated once (pydantic)
    devices.py    catalog device type <-> ``nvidia.com/gpu.product`` node label

The operator uses the package's public spec API only, never its runtime.
"""

GROUP = "orchestrator.io"
VERSION = "v1alpha1"
PLURAL = "heterotrainingjobs"
KIND = "HeteroTrainingJob"
