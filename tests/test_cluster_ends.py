"""The cluster driver's ledger of turn ends (`swarm.cluster.client.TurnEnds`):
whichever way an owner's two streams arrive, and whenever the owner dies, the
merged log holds exactly one terminal event per turn, and nothing is kept after.

No Ray here: the ledger is a plain object, driven through every order in which
the driver can see the two streams of one owner."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runtime.events.bus import EventBus
from runtime.events.kinds import Ended, Failed, Finished
from swarm.cluster.client import TurnEnds

TURN = 7


def finished(owner: str) -> Ended:
    return Finished(t=1.0, step=3, turn=TURN, agent="a", priority=0, tokens=4, reason="length", owner=owner)


class Driver:
    """One turn pumped on owner gpu0, seen as the driver's tasks would see it:
    `follow` reading gpu0's events, the pump reading its turn's updates."""

    def __init__(self) -> None:
        self.bus = EventBus(clock=lambda: 0.0)
        self.log = self.bus.subscribe()
        self.ends = TurnEnds(self.bus)
        self.pump_on: str | None = "gpu0"  # the owner the pump waits on; None once it ended
        self.told: Ended | None = None  # what the agent heard

    def follow_brings_end(self) -> None:
        self.ends.owner_said(finished("gpu0"), pumping=self.pump_on == "gpu0")

    def follow_ends(self) -> None:
        self.ends.owner_done("gpu0")

    def pump_hears_end(self) -> None:
        self.ends.pump_heard(finished("gpu0"))
        self.told, self.pump_on = finished("gpu0"), None
        self.ends.forget(TURN)

    def pump_hears_lost(self, moves: bool) -> None:
        logged = self.ends.owner_lost("gpu0", TURN)
        if logged is not None:  # gpu0 had ended it after all
            self.told, self.pump_on = logged, None
        elif moves:  # to gpu1, which runs it to its end (both its streams arrive)
            self.pump_on = "gpu1"
            self.ends.owner_said(finished("gpu1"), pumping=True)
            self.ends.pump_heard(finished("gpu1"))
            self.ends.owner_done("gpu1")
            self.told, self.pump_on = finished("gpu1"), None
        else:  # no owner left: the driver fails it
            failed = Failed(t=2.0, step=0, turn=TURN, agent="a", priority=0, tokens=0, reason="every GPU owner is lost")
            self.told = self.ends.decided_here(failed) or failed
            self.pump_on = None
        self.ends.forget(TURN)

    def logged_ends(self) -> list[Ended]:
        return [e for e in self.log.take_ready() if isinstance(e, Ended)]


@given(
    # Which of the owner's two streams carried its end before it died (both, if it lived).
    follow_has_end=st.booleans(),
    pump_has_end=st.booleans(),
    moves=st.booleans(),
    order=st.permutations(["follow", "pump", "stream end"]),
)
def test_every_order_of_an_owners_two_streams_logs_one_end(follow_has_end: bool, pump_has_end: bool, moves: bool, order: list[str]) -> None:
    d = Driver()
    for step in order:
        if step == "follow":
            if follow_has_end and order.index("follow") < order.index("stream end"):
                d.follow_brings_end()
        elif step == "pump":
            if pump_has_end:
                d.pump_hears_end()
            else:
                d.pump_hears_lost(moves)
        else:
            d.follow_ends()
    (end,) = d.logged_ends()  # exactly one, in every order
    assert d.told is not None and d.told.owner == end.owner and type(d.told) is type(end)
    # and nothing is left behind once the turn and the owner's stream are over
    assert not d.ends._awaited and not d.ends._logged and not d.ends._disowned


def test_an_end_only_the_pump_heard_is_logged_when_the_dead_owners_stream_ends() -> None:
    d = Driver()
    d.pump_hears_end()
    assert d.logged_ends() == []  # the event stream should bring it, in the owner's order
    d.follow_ends()  # the owner died first
    assert d.logged_ends() == [finished("gpu0")]


def test_a_late_end_from_an_owner_the_turn_was_moved_off_is_not_logged() -> None:
    d = Driver()
    d.pump_hears_lost(moves=True)
    assert d.logged_ends() == [finished("gpu1")]
    d.follow_brings_end()  # gpu0's stream still held its end of the turn
    d.follow_ends()
    assert d.logged_ends() == []
