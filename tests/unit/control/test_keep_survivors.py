"""The controller with a worker port that keeps its survivors across a change of plan.

The fake port re-forms in place: a REPLICAS restore without states takes each layer from a live
rank of the running group (as the Ray port moves it actor to actor). The controller must then
neither read the states itself nor stop the group, and a failed re-formation must not restart
from the seed (the state that was in the workers is gone: the checkpoint is the restore).
"""

from __future__ import annotations

from control_fakes import NUM_LAYERS, FakeWorkerGroup, make_harness

from orchestrator.control.ports import WorkerLost
from orchestrator.control.recovery import RestoreKind, RestoreSource
from orchestrator.spec.plan import Plan


class KeepingWorkerGroup(FakeWorkerGroup):
    keeps_survivors = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fetches = 0
        self.fail_next_reform = False
        self.reforms = 0
        self.received: list[RestoreSource] = []  # as the controller handed them over

    def launch(self, plan: Plan, restore: RestoreSource) -> None:
        self.received.append(restore)
        if restore.kind is RestoreKind.REPLICAS and not restore.states and self.plan is not None:
            self.reforms += 1
            if self.fail_next_reform:
                self.fail_next_reform = False
                self.stop()  # as the Ray port does: a half re-formed group holds nothing
                raise WorkerLost((), (), "rendezvous broke")
            live = {
                layer: self.state[rank][layer]
                for rank, layers in self.state.items()
                if self.cluster.alive(self.rank_node[rank])
                for layer in layers
            }
            restore = RestoreSource(RestoreKind.REPLICAS, restore.resume_step, states=live)
        elif restore.kind is RestoreKind.REPLICAS and not restore.states:
            raise WorkerLost((), (), "the workers holding the state are gone")
        super().launch(plan, restore)

    def fetch_layer_states(self, sources):
        self.fetches += 1
        return super().fetch_layer_states(sources)


def _harness(**config):
    h = make_harness([("a", "A100-80", 2), ("b", "A100-80", 2)], **config)
    keeping = KeepingWorkerGroup(h.cluster, h.clock, h.store)
    h.controller.ctx.workers = keeping
    h.workers = keeping
    return h


def test_a_lost_node_is_recovered_in_place_without_reading_or_stopping():
    h = _harness(total_steps=20, checkpoint_interval_steps=0)
    h.states_until(lambda c: c.state.name == "running" and c.next_step == 6)
    h.cluster.kill("b")
    h.states_until(lambda c: c.done)
    c = h.controller
    assert c.state.name == "finished", c.events[-1].message
    assert h.workers.reforms == 1
    # Recovery read nothing through the controller and stopped nothing; only the end stops.
    assert h.workers.stops == 1
    [_, second] = h.workers.received
    assert second.kind is RestoreKind.REPLICAS and not second.states
    assert c.lost_steps_total == 0
    # Only the final checkpoint reads the layers.
    assert h.workers.fetches == 1
    assert h.final_layer_states() == {i: tuple(range(20)) for i in range(NUM_LAYERS)}


def test_a_failed_re_formation_falls_back_to_the_checkpoint_not_the_seed():
    h = _harness(total_steps=20, checkpoint_interval_steps=5)
    h.states_until(lambda c: c.state.name == "running" and c.next_step == 7)
    h.workers.fail_next_reform = True
    h.cluster.kill("b")
    h.states_until(lambda c: c.done)
    c = h.controller
    assert c.state.name == "finished", c.events[-1].message
    restores = h.workers.received
    assert restores[-1].kind is RestoreKind.CHECKPOINT and restores[-1].checkpoint_step == 5
    assert c.lost_steps_total == 2  # steps 5 and 6, trained again from the checkpoint at 5
    assert h.final_layer_states() == {i: tuple(range(20)) for i in range(NUM_LAYERS)}
