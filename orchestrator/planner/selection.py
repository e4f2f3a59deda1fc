"""Choosing how many replicas of which templates to run, for one microbatch size.

The space: every device type may run replicas of one or two single-type templates, and pairs of
types may share two-type replicas. Per type, the few templates that do best alone are kept; their
combinations across types are enumerated when few, else improved by coordinate descent. Leftover
devices are then offered a second template, and two-type replicas are tried on top. Each candidate
is scored by :func:`~orchestrator.planner.batching.selection_step_s` (water-filled batch shares,
all-reduce, optimizer), which costs O(number of templates), not O(number of replicas).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from orchestrator.costmodel.tables import CostTables
from orchestrator.planner.batching import Group, selection_step_s
from orchestrator.planner.templates import (
    Template,
    TypeInfo,
    chained_templates,
    homogeneous_templates,
    mixed_templates,
)
from orchestrator.spec.plan import Sharding


@dataclass(frozen=True)
class SearchConfig:
    """Knobs that trade search time for coverage (defaults meet the speed targets)."""

    keep_per_type: int = 4
    max_enumerated_combinations: int = 256
    descent_rounds: int = 4
    mixed: bool = True
    max_mixed_depth_each: int = 8
    # Three-type replicas (clusters of three or more types): stages per type at most this many
    # (0: none). Kept small: every order of every triple times each type's tp degrees multiplies
    # the templates.
    max_triple_depth_each: int = 2
    mixed_rounds: int = 2
    mixed_beam_width: int = 8
    mixed_templates_per_round: int = 64
    # Two-type replicas are tried at this many of the best microbatch sizes.
    mixed_microbatch_sizes: int = 2
    # Two-type replicas are tried when some type cannot hold the model alone, or when the cluster
    # is at most this large (beyond it, whole single-type replicas with uneven batch shares reach
    # the same speed and the extra candidates only cost search time).
    mixed_device_limit: int = 64
    # The sharded data-parallel candidate (planner/sharded.py), chosen where the cost model
    # says it is faster than every unsharded plan.
    sharded: bool = True
    # Keep the sharded candidate only where no unsharded plan fits. An elastic run wants every
    # layer's whole state on some survivor: a lost shard holder costs the steps since the last
    # checkpoint, which a few percent of step time does not buy back.
    sharded_only_if_needed: bool = False


@dataclass(frozen=True)
class Selection:
    groups: tuple[Group, ...]
    step_s: float

    def __post_init__(self) -> None:
        # Read by every comparison of the search: built once.
        key = (self.step_s, tuple((g.template.key, g.count) for g in self.groups))
        object.__setattr__(self, "_key", key)

    _key: tuple[object, ...] = field(init=False, compare=False, repr=False)

    @property
    def key(self) -> tuple[object, ...]:
        return self._key


def _score(groups: list[Group], batch: int, infos: dict[str, TypeInfo]) -> Selection | None:
    live = sorted((g for g in groups if g.count > 0), key=lambda g: g.template.key)
    if any(g.count < g.template.shard_k for g in live):
        return None  # a sharded template's memory holds only with its shard group whole
    step = selection_step_s(live, batch, infos)
    return None if step is None else Selection(tuple(live), step)


def _better(a: Selection | None, b: Selection | None) -> Selection | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if a.key <= b.key else b


def _fit_counts(groups: list[Group], free: dict[str, int]) -> list[Group]:
    """Reduce group counts, in order, so their device usage fits ``free``."""
    left = dict(free)
    out = []
    for g in groups:
        count = min([g.count] + [left.get(name, 0) // n for name, n in g.template.usage.items()])
        for name, n in g.template.usage.items():
            left[name] = left.get(name, 0) - count * n
        out.append(Group(g.template, count))
    return out


class SelectionSearch:
    """Search over template selections for one microbatch size."""

    def __init__(
        self,
        tables: CostTables,
        infos: dict[str, TypeInfo],
        global_batch_size: int,
        microbatch_size: int,
        config: SearchConfig,
        sharded: Sharding | None = None,
        built: dict[str, list[Template]] | None = None,
        sharded_types: frozenset[str] | None = None,
        variants: bool = False,
    ) -> None:
        """``sharded``: also offer single-type pipelines that fit only with their replicas
        sharding their state at that level (templates.homogeneous_templates), on
        ``sharded_types`` (default: every type), and with ``variants`` the sharded variants of
        the tp-1 pipelines that fit unsharded too; ``built``: the unsharded templates already
        built per type at this microbatch size, reused for the other types."""
        self.tables, self.infos, self.config = tables, infos, config
        self.batch, self.mbs = global_batch_size, microbatch_size
        self.max_replicas = -(-global_batch_size // microbatch_size)
        # Scores by the sorted (template id, count) pairs; the templates outlive the search
        # (kept in ``tables.templates`` and in the candidate lists), so their ids stay theirs.
        self._scores: dict[tuple[tuple[int, int], ...], Selection | None] = {}
        self.homogeneous = {}
        for d in sorted(infos):
            offer = sharded is not None and (sharded_types is None or d in sharded_types)
            if built is not None and d in built and not offer:
                self.homogeneous[d] = built[d]
                continue
            self.homogeneous[d] = homogeneous_templates(
                tables,
                infos,
                d,
                microbatch_size,
                sharded if offer else None,
                self.max_replicas,
                variants,
            )

    def _score(self, groups: list[Group]) -> Selection | None:
        """:func:`_score`, kept per set of (template, count): the beam and the descent reach
        the same selection from different states (about half the scores at 64 GPUs). Only
        where every template appears once: distinct templates have distinct keys (one solve
        per shape), so the groups' order in the selection is then the set's alone."""
        pairs = [(id(g.template), g.count) for g in groups if g.count > 0]
        key = tuple(sorted(pairs))
        if len({i for i, _ in pairs}) < len(pairs):
            return _score(groups, self.batch, self.infos)
        if key in self._scores:
            return self._scores[key]
        found = self._scores[key] = _score(groups, self.batch, self.infos)
        return found

    def _alone(self, template: Template) -> Group:
        info = self.infos[template.stage_types[0][0]]
        return Group(template, min(info.num_devices // template.num_devices, self.max_replicas))

    def _options(self, device_type: str) -> list[Group | None]:
        """``None`` (type unused) plus the templates that do best on this type alone."""
        scored = []
        for t in self.homogeneous[device_type]:
            sel = self._score([self._alone(t)])
            if sel is not None:
                scored.append(sel)
        scored.sort(key=lambda s: s.key)
        return [None, *(s.groups[0] for s in scored[: self.config.keep_per_type])]

    def _best_tp(self, device_type: str) -> int:
        """The tp degree of ``device_type``'s best single-type pipeline alone (1 if none)."""
        found = self._options(device_type)
        best = found[1] if len(found) > 1 else None
        return 1 if best is None else best.template.stage_types[0][1]

    def _combine(self, options: dict[str, list[Group | None]]) -> Selection | None:
        types = sorted(options)
        sizes = [len(options[d]) for d in types]
        total = 1
        for n in sizes:
            total *= n
        best: Selection | None = None
        if total <= self.config.max_enumerated_combinations:
            for combo in itertools.product(*(options[d] for d in types)):
                best = _better(best, self._score([g for g in combo if g]))
            return best
        # Coordinate descent from every type's best-alone template.
        choice = {d: (1 if len(options[d]) > 1 else 0) for d in types}
        best = self._score([g for d in types if (g := options[d][choice[d]])])
        for _ in range(self.config.descent_rounds):
            improved = False
            for d in types:
                for i in range(len(options[d])):
                    trial = dict(choice, **{d: i})
                    groups = [g for t in types if (g := options[t][trial[t]])]
                    found = _better(best, self._score(groups))
                    if found is not best:
                        best, choice, improved = found, trial, True
            if not improved:
                break
        return best

    def _fill_leftovers(self, sel: Selection, types: list[str]) -> Selection:
        """Offer devices the chosen templates leave unused a second, smaller template."""
        best = sel
        for d in types:
            used = sum(g.count * g.template.usage.get(d, 0) for g in best.groups)
            left = self.infos[d].num_devices - used
            for t in self.homogeneous[d]:
                if t.num_devices <= left:
                    extra = Group(t, left // t.num_devices)
                    best = (
                        _better(best, self._score([*best.groups, extra])) or best
                    )
        return best

    def _with_mixed(self, sel: Selection | None) -> Selection | None:
        """Add two-type (and, on three or more types, three-type) replicas on top of ``sel``,
        one template per round (greedy)."""
        cfg = self.config
        total_devices = sum(i.num_devices for i in self.infos.values())
        stranded = any(not self.homogeneous[d] for d in self.infos)
        small = total_devices <= cfg.mixed_device_limit
        if not cfg.mixed or len(self.infos) < 2 or not (stranded or small):
            return sel
        # Each type's stages run at tp 1 or at the tp of its best pipeline alone (tensor
        # parallelism within a node, as the runtime executes it, for any type of the pair).
        tps = {d: sorted({1, self._best_tp(d)}) for d in self.infos}
        candidates = [
            t
            for first, second in itertools.permutations(sorted(self.infos), 2)
            for tp1 in tps[first]
            for tp2 in tps[second]
            for t in mixed_templates(
                self.tables,
                self.infos,
                first,
                second,
                self.mbs,
                cfg.max_mixed_depth_each,
                (tp1, tp2),
            )
        ]
        best = self._beam(sel, candidates)
        # Three-type replicas in a beam of their own, on top of the two-type result: sharing
        # the first beam would let their many shapes push out the two-type expansions.
        triples = self._triples({d: [self._best_tp(d)] for d in self.infos})
        return _better(best, self._beam(best, triples)) if triples else best

    def _beam(self, sel: Selection | None, candidates: list[Template]) -> Selection | None:
        """The best of ``sel`` and the selections found by adding ``candidates`` to it, a few
        rounds of a beam search."""
        cfg = self.config
        free = {d: i.num_devices for d, i in self.infos.items()}
        # Beam search: two-type replicas often pay off only in pairs (one absorbs what the other
        # leaves), so a round keeps its few best expansions even when they do not yet improve.
        best = sel
        beam: list[Selection | None] = [sel]
        for _ in range(cfg.mixed_rounds):
            expansions: dict[tuple[object, ...], Selection] = {}
            score_by_template: dict[int, float] = {}
            # The replica counts tried of each candidate (up to the most the devices hold).
            tries_of: dict[int, list[int]] = {}
            for state in beam:
                base = list(state.groups) if state else []
                for i, t in enumerate(candidates):
                    tries = tries_of.get(i)
                    if tries is None:
                        most = min(free[d] // n for d, n in t.usage.items())
                        tries = sorted(c for c in {1, 2, 4, 8, 16, most} if 1 <= c <= most)
                        tries_of[i] = tries
                    for count in tries:
                        left = dict(free)
                        for d, n in t.usage.items():
                            left[d] -= count * n
                        groups = [Group(t, count), *_fit_counts(base, left)]
                        found = self._score(groups)
                        if found is not None:
                            expansions[found.key] = found
                            score_by_template[i] = min(
                                score_by_template.get(i, float("inf")), found.step_s
                            )
            if not expansions:
                break
            ranked = [expansions[k] for k in sorted(expansions)]
            best = _better(best, ranked[0])
            beam = list(ranked[: cfg.mixed_beam_width])
            # The next round expands with the templates that did best in this one.
            keep = sorted(score_by_template, key=lambda i: (score_by_template[i], i))
            candidates = [candidates[i] for i in keep[: cfg.mixed_templates_per_round]]
        return best

    def _triples(self, tps: dict[str, list[int]]) -> list[Template]:
        """Three-type replicas: every order of every three types, each type's stages
        contiguous at its tp options (``tps``: the tp of its best pipeline alone), up to
        ``max_triple_depth_each`` stages each."""
        depth = self.config.max_triple_depth_each
        if depth < 1 or len(self.infos) < 3:
            return []
        return [
            t
            for order in itertools.permutations(sorted(self.infos), 3)
            for degrees in itertools.product(*(tps[d] for d in order))
            for t in chained_templates(self.tables, self.infos, order, self.mbs, depth, degrees)
        ]

    def run(self, device_types: list[str] | None = None, mixed: bool = True) -> Selection | None:
        """Best selection using only ``device_types`` (default: all present)."""
        types = sorted(device_types or self.infos)
        options = {d: self._options(d) for d in types}
        best = self._combine(options)
        if best is not None:
            best = self._fill_leftovers(best, types)
        if device_types is None and mixed:
            best = self._with_mixed(best)
        return best

    def add_mixed(self, sel: Selection | None) -> Selection | None:
        """Try two-type replicas on top of a single-type selection from :meth:`run`."""
        return self._with_mixed(sel)
