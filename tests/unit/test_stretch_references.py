"""An emulated device keeps its measured speed across the engines of one process
(``Stretcher.adopt_references``, used when a kept actor re-forms onto the same work) and across
the processes of one host running the same work (``SharedReferences``), sharded holders of a
stage included."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.spec.plan import Plan
from orchestrator.worker import topology
from orchestrator.worker.emulation import SHARED_REFERENCES_ENV, SharedReferences, Stretcher
from orchestrator.worker.engine import StageEngine, _shared_references


def _busy(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_new_stretcher_adopts_the_least_cpu_time_seen_before() -> None:
    earlier = Stretcher(4.0)
    earlier.run(lambda: _busy(0.01), key="forward")
    least = earlier.reference_cpu_s("forward")
    assert least is not None
    later = Stretcher(4.0)
    later.adopt_references(earlier)
    later.reset()
    later.run(lambda: _busy(0.03), key="forward")  # slower now (a busy host): the least counts
    assert later.reference_cpu_s("forward") == least
    # Stretched from the adopted 0.01 s (about 0.04 s), not from this call's 0.03 s (0.12 s).
    assert later.compute_s < 4.0 * 0.03


def test_adopting_keeps_a_lower_time_of_its_own_and_keys_it_alone_has() -> None:
    earlier = Stretcher(2.0)
    earlier.run(lambda: _busy(0.02), key="forward")
    later = Stretcher(2.0)
    later.run(lambda: _busy(0.005), key="forward")
    later.run(lambda: _busy(0.005), key="update")
    own = later.reference_cpu_s("forward")
    later.adopt_references(earlier)
    assert later.reference_cpu_s("forward") == own
    assert later.reference_cpu_s("update") is not None


def test_a_process_starting_later_takes_the_times_shared_on_this_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SHARED_REFERENCES_ENV, str(tmp_path))
    first = Stretcher(4.0, SharedReferences.for_work("model x, layers 0-6"))
    first.run(lambda: _busy(0.01), key=("forward", 8))
    least = first.reference_cpu_s(("forward", 8))
    assert least is not None
    # Another process (a joiner) on the same work: the least time is its own from the start.
    joiner = Stretcher(4.0, SharedReferences.for_work("model x, layers 0-6"))
    joiner.run(lambda: _busy(0.03), key=("forward", 8))
    assert joiner.reference_cpu_s(("forward", 8)) == least
    # Other work shares nothing.
    other = Stretcher(4.0, SharedReferences.for_work("model x, layers 0-3"))
    other.run(lambda: _busy(0.03), key=("forward", 8))
    assert other.reference_cpu_s(("forward", 8)) > least


def test_ranks_started_together_take_each_others_times_from_the_next_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SHARED_REFERENCES_ENV, str(tmp_path))
    work = "model x, layers 0-6"
    quick = Stretcher(4.0, SharedReferences.for_work(work))
    slow = Stretcher(4.0, SharedReferences.for_work(work))  # both started before either ran
    slow.run(lambda: _busy(0.03), key=("forward", 8))  # its core was busy: a high least
    quick.run(lambda: _busy(0.01), key=("forward", 8))
    least = quick.reference_cpu_s(("forward", 8))
    assert least is not None and least < 0.02
    slow.reset()  # the next step
    slow.run(lambda: _busy(0.03), key=("forward", 8))
    assert slow.reference_cpu_s(("forward", 8)) == least
    # stretched from the shared 0.01 s, not from its own 0.03 s
    assert slow.compute_s < 4.0 * 0.03


def test_nothing_is_shared_without_the_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SHARED_REFERENCES_ENV, raising=False)
    assert SharedReferences.for_work("model x") is None


def _holders_plan(sharding: str, tp: int = 1) -> Plan:
    return Plan.model_validate(
        {
            "global_batch_size": 6,
            "microbatch_size": 1,
            "replicas": [
                {
                    "batch_size": b,
                    "stages": [
                        {"layers": [0, 4], "device_type": "A", "sharding": sharding, "tp": tp}
                    ],
                }
                for b in (3, 2, 1)
            ],
        }
    )


def _config(plan: Plan) -> SimpleNamespace:
    return SimpleNamespace(
        plan=plan,
        model_factory="orchestrator.models.gpt:make_gpt",
        model_kwargs={"num_layers": 2},
        precision="fp32",
        optimizer="adam",
        overlap_grad_reduce=False,
    )


def _shared(plan: Plan) -> list[SharedReferences | None]:
    config = _config(plan)
    return [_shared_references(config, spec) for spec in topology.ranks_for_plan(plan)]  # type: ignore[arg-type]


@pytest.mark.parametrize("level", ["optimizer", "gradients", "full"])
def test_holders_that_shard_a_stage_share_its_reference_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, level: str
) -> None:
    monkeypatch.setenv(SHARED_REFERENCES_ENV, str(tmp_path))
    sharded = _shared(_holders_plan(level))
    assert all(s is not None for s in sharded)
    # the three holders run the same forward and backward: one file
    assert len({s.path for s in sharded if s is not None}) == 1
    # unsharded holders of the same layers, or another level, do other work: another file
    (plain, *_) = _shared(_holders_plan("none"))
    assert plain is not None and plain.path != sharded[0].path  # type: ignore[union-attr]


def test_tensor_parallel_ranks_share_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SHARED_REFERENCES_ENV, str(tmp_path))
    plan = _holders_plan("none", tp=2)
    assert all(s is None for s in _shared(plan))


def test_a_sharded_update_is_keyed_by_the_slices_it_steps() -> None:
    def key(slices: tuple[int, ...] | None) -> object:
        fake = SimpleNamespace(
            sharding=None if slices is None else SimpleNamespace(slice_numels=slices)
        )
        return StageEngine._update_key(fake)  # type: ignore[arg-type]

    # holders of slices of different sizes do different update work: their keys differ
    assert key((100,)) != key((99,))
    assert key((100,)) == key((100,))
    assert key(None) != key((100,))
