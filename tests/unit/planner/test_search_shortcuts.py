"""The search's shortcuts give what the long way gives.

- The split's greedy bisection skips budgets where a failed pass would fail again: same least
  budget as plain bisection, in fewer passes.
- The common deadline of a selection is found among the instants replicas finish microbatches:
  the same microbatch counts as bisection over time.
- A shape whose memory caps cannot hold its layers' least needs is refused unsolved: only
  shapes that no split fits, with any stages recomputing.
- The split skips its exact check below the greedy optimum where every layer fits every stage.
- The recompute count is found checking only whether a split fits memory, the split's time
  solved once at the count found.
- Where greedy finds no split with time unbounded and every layer fits every stage, memory
  rules out every split: no exact check is run (memory checks and splits alike).
"""

from __future__ import annotations

import random

import pytest

import orchestrator.planner.partition as partition
import orchestrator.planner.templates as templates
from orchestrator.costmodel import CostTables
from orchestrator.planner.batching import Group, _microbatches_by, pipeline_deadline_s
from orchestrator.planner.partition import StageCosts
from orchestrator.spec import ClusterSpec, ModelSpec, TrainingSpec

from .test_partition_and_batching import _literal_table


def _counting(calls: dict[str, int]):
    def check(*args):
        calls["plain"] += 1
        return partition._greedy(*args)

    return check


def _counting_event(calls: dict[str, int], event_pass):
    def check(*args):
        calls["skipping"] += 1
        return event_pass(*args)

    return check


def test_greedy_bisection_with_skips_ends_where_plain_bisection_ends() -> None:
    rng = random.Random(3)
    fewer = 0
    for _ in range(300):
        n = rng.randint(2, 30)
        p = rng.randint(1, min(6, n))
        stages = [
            StageCosts(
                _literal_table(
                    [rng.choice([0.1, 1.0, 5.0]) * rng.random() for _ in range(n)],
                    [rng.random() for _ in range(n)],
                ),
                rng.choice([0.0, 0.3]),
                1,
                rng.choice([float("inf"), 4.0, 2.0]),
            )
            for _ in range(p)
        ]
        hi = max(s.table.compute_s(0, n) + s.comm_s for s in stages) * (1 + 1e-12)
        start = partition._greedy(stages, n, hi)
        if start is None:
            continue
        calls = {"plain": 0, "skipping": 0}
        _, plain_hi, _ = partition._bisect(_counting(calls), stages, n, 0.0, hi, start)
        event_pass = partition._greedy_event
        partition._greedy_event = _counting_event(calls, event_pass)  # type: ignore[assignment]
        try:
            _, new_hi, found = partition._bisect_greedy(stages, n, 0.0, hi, start)
        finally:
            partition._greedy_event = event_pass  # type: ignore[assignment]
        assert new_hi == pytest.approx(plain_hi, rel=2e-7)
        assert partition._bottleneck_s(stages, found) <= new_hi * (1 + 1e-12)
        fewer += calls["skipping"] < calls["plain"]
    assert fewer > 100  # the skips save passes on most instances


def _plain_deadline(shape: list[tuple[int, float, float]], total: int) -> float:
    """Bisection over time, as the search did before."""

    def done_by(deadline: float) -> int:
        return sum(c * (int((deadline - s) / t) + 1) for c, s, t in shape if deadline >= s)

    lo = max(s for _, s, _ in shape)
    if done_by(lo) >= total:
        return lo
    rate = sum(c / t for c, _, t in shape)
    offset = sum(c * s / t for c, s, t in shape)
    lo = max(lo, (total - sum(c for c, _, _ in shape) + offset) / rate)
    hi = max(lo, (total + offset) / rate) * (1 + 1e-12)
    while done_by(hi) < total:
        hi += max(t for _, _, t in shape)
    for _ in range(80):
        if hi - lo <= 1e-12 * hi:
            break
        mid = (lo + hi) / 2
        if done_by(mid) >= total:
            hi = mid
        else:
            lo = mid
    return hi


class _Shape:
    def __init__(self, sum_s: float, bottleneck_s: float) -> None:
        self.sum_s, self.bottleneck_s = sum_s, bottleneck_s


def test_deadline_among_finish_instants_gives_the_counts_of_bisection() -> None:
    rng = random.Random(11)
    for _ in range(5000):
        shape = []
        for _ in range(rng.randint(1, 5)):
            t = rng.choice([0.1, 0.25, 1 / 3, 0.7, 1.0, rng.uniform(0.05, 2.0)])
            shape.append((rng.randint(1, 8), t * rng.randint(1, 6) * rng.choice([1, 0.8]), t))
        total = rng.randint(sum(c for c, _, _ in shape), 400)
        groups = [Group(_Shape(s, t), c) for c, s, t in shape]  # type: ignore[arg-type]
        found = pipeline_deadline_s(groups, total)
        want = _plain_deadline(shape, total)
        assert found == pytest.approx(want, rel=1e-11)
        assert [_microbatches_by(g.template, found) for g in groups] == [
            _microbatches_by(g.template, want) for g in groups
        ]


def test_memory_rule_refuses_only_shapes_no_split_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    # A 13B-like model on 16 GiB and 24 GiB devices: shallow pipelines cannot hold it.
    model = ModelSpec(
        name="gpt-24L",
        num_layers=24,
        hidden_size=5120,
        num_heads=40,
        sequence_length=2048,
        vocab_size=50257,
        dtype="bf16",
    )
    cluster = ClusterSpec(
        node_groups=[
            {"name": t.lower(), "device_type": t, "num_nodes": 1, "devices_per_node": 8}
            for t in ("T4", "L4")
        ]
    ).resolve()
    training = TrainingSpec(global_batch_size=64, microbatch_sizes=[1, 2])
    tables = CostTables.for_cluster(model, training, cluster)
    infos = templates.type_infos(cluster, model, training)
    shapes = [
        (("T4", tp),) * a + (("L4", tp),) * b
        for tp in (1, 2)
        for a in range(0, 8 // tp + 1)
        for b in range(0, 8 // tp + 1)
        if a + b > 0
    ]
    ruled, solved = 0, 0
    rule = templates._memory_rules_out
    for mbs in (1, 2):
        for shape in shapes:
            out = rule(tables, infos, shape, mbs)
            monkeypatch.setattr(templates, "_memory_rules_out", lambda *a: False)
            found = templates._solve_template(tables, infos, shape, mbs, None)
            monkeypatch.setattr(templates, "_memory_rules_out", rule)
            if out:
                assert found is None, shape
                ruled += 1
            solved += found is not None
    assert ruled > 0 and solved > 0  # both kinds occur here


def test_split_where_greedy_is_exact_matches_the_exact_certificate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The split skips the exact check below the greedy optimum where every layer fits every
    # stage (greedy then fails only where no split fits): same split as with the exact check.
    rng = random.Random(5)
    exact_is = partition._greedy_is_exact
    calls = {"shortcut": 0}

    def counted(*args: object) -> bool:
        found = exact_is(*args)  # type: ignore[arg-type]
        calls["shortcut"] += found
        return found

    for _ in range(300):
        n = rng.randint(2, 30)
        p = rng.randint(1, min(6, n))
        stages = [
            StageCosts(
                _literal_table(
                    [rng.choice([0.1, 1.0, 5.0]) * rng.random() for _ in range(n)],
                    [rng.random() for _ in range(n)],
                ),
                rng.choice([0.0, 0.3]),
                1,
                rng.choice([float("inf"), 4.0, 2.0]),
            )
            for _ in range(p)
        ]
        monkeypatch.setattr(partition, "_greedy_is_exact", counted)
        fast = partition.split_layers(stages, n)
        monkeypatch.setattr(partition, "_greedy_is_exact", lambda *a: False)
        slow = partition.split_layers(stages, n)
        assert fast == slow
    assert calls["shortcut"] > 50  # the shortcut is taken on many instances


def _recompute_by_full_solves(tables, infos, shape, mbs):  # type: ignore[no-untyped-def]
    """The recompute count's bisection solving every count it tries (as it did before)."""
    p = len(shape)

    def with_first(count: int):  # type: ignore[no-untyped-def]
        flags = tuple(s < count for s in range(p))
        return templates._build_template(tables, infos, shape, mbs, flags)

    found = with_first(0)
    if found is not None:
        return found
    lo, hi = 0, p - 1
    best = with_first(hi) if hi > 0 else None
    if best is None:
        return with_first(p)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        found = with_first(mid)
        if found is None:
            lo = mid
        else:
            hi, best = mid, found
    return best


def test_recompute_count_found_by_memory_checks_is_the_count_full_solves_find() -> None:
    # Deep mixed pipelines of a 13B-like model on 16 GiB and 24 GiB devices, several of which
    # need some stages recomputing: the count found checking only whether a split fits memory
    # gives the template that solving every count tried gives.
    model = ModelSpec(
        name="gpt-24L",
        num_layers=24,
        hidden_size=5120,
        num_heads=40,
        sequence_length=2048,
        vocab_size=50257,
        dtype="bf16",
    )
    cluster = ClusterSpec(
        node_groups=[
            {"name": t.lower(), "device_type": t, "num_nodes": 1, "devices_per_node": 8}
            for t in ("T4", "L4")
        ]
    ).resolve()
    training = TrainingSpec(global_batch_size=64, microbatch_sizes=[1, 2])
    tables = CostTables.for_cluster(model, training, cluster)
    infos = templates.type_infos(cluster, model, training)
    recomputing = 0
    for mbs in (1, 2):
        for a in range(0, 9):
            for b in range(0, 9):
                if a + b == 0:
                    continue
                shape = (("T4", 1),) * a + (("L4", 1),) * b
                found = templates._solve_template(tables, infos, shape, mbs, None)
                want = _recompute_by_full_solves(tables, infos, shape, mbs)
                assert found == want, shape
                recomputing += found is not None and any(found.recompute)
    assert recomputing > 0  # some shapes fit only with stages recomputing


def test_memory_refusal_where_greedy_is_exact_matches_the_exact_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Tight memory caps (each stage holds a few of the layers): where greedy fails with time
    # unbounded and every layer fits every stage, fits_memory and split_layers refuse without
    # the exact reachability check, and give what they give with it.
    rng = random.Random(17)
    exact_is = partition._greedy_is_exact
    calls = {"refused": 0, "fits": 0}
    for _ in range(600):
        n = rng.randint(2, 30)
        p = rng.randint(1, min(6, n))
        mems = [rng.choice([0.2, 1.0]) * rng.random() for _ in range(n)]
        stages = [
            StageCosts(
                _literal_table([rng.random() for _ in range(n)], mems),
                rng.choice([0.0, 0.3]),
                rng.randint(1, 3),
                rng.choice([sum(mems) / p * f for f in (0.8, 1.0, 1.2, 1.6)] + [0.3]),
            )
            for _ in range(p)
        ]
        fast = (partition.fits_memory(stages, n), partition.split_layers(stages, n))
        monkeypatch.setattr(partition, "_greedy_is_exact", lambda *a: False)
        slow = (partition.fits_memory(stages, n), partition.split_layers(stages, n))
        monkeypatch.setattr(partition, "_greedy_is_exact", exact_is)
        assert fast == slow
        assert fast[0] == (fast[1] is not None)
        hi = partition._no_time_limit_s(stages, n)
        largest = [partition._largest_layer(st) for st in stages]
        if partition._greedy(stages, n, hi) is None and exact_is(stages, n, hi, largest):
            calls["refused"] += 1  # the shortcut decided these
        calls["fits"] += fast[0]
    assert calls["refused"] > 50 and calls["fits"] > 50  # both outcomes occur often
