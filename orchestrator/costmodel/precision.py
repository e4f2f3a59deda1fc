"""The model and training settings as the cost model sees a run in one number format.

The cost model reads the format in two places: ``ModelSpec.dtype`` (which catalog peak applies,
bytes of activations and stage-boundary tensors, which profiles describe the run) and
``TrainingSpec.precision`` (bytes of weights, gradients and optimizer state). A run in a chosen
format is costed with both set to it, so a plan's estimate is the estimate of what its workers
compute in.
"""

from __future__ import annotations

from orchestrator.spec.devices import Dtype
from orchestrator.spec.model import ModelSpec, TrainingSpec


def run_precision(training: TrainingSpec, plan_precision: Dtype | None = None) -> Dtype | None:
    """The format a run computes in: the plan's when it records one, else the format
    ``training.precision`` names; None when neither says (unset, or ``auto`` before planning)."""
    return plan_precision or training.explicit_precision


def costed_inputs(
    model: ModelSpec, training: TrainingSpec, plan_precision: Dtype | None = None
) -> tuple[ModelSpec, TrainingSpec]:
    """``(model, training)`` with the run's format (:func:`run_precision`) in both; unchanged
    when no format is known (the model's dtype is costed, as without ``training.precision``)."""
    precision = run_precision(training, plan_precision)
    if precision is None:
        return model, training
    if model.dtype is not precision:
        model = model.model_copy(update={"dtype": precision})
    if training.precision is not precision:
        training = training.model_copy(update={"precision": precision})
    return model, training
