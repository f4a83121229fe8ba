"""Placement of agents on a cluster's GPU owners: pure, no Ray needed."""

from __future__ import annotations

import pytest

from runtime.errors import ConfigError
from runtime.scheduling.priority import BACKGROUND, FOREGROUND
from swarm.cluster.placement import LeastLoaded, OwnerLoad, Pinned, Router


def test_least_loaded_weighs_priority_not_turn_count() -> None:
    owners = [OwnerLoad("gpu0", mass=FOREGROUND + 1, turns=1), OwnerLoad("gpu1", mass=3 * (BACKGROUND + 1), turns=3)]
    assert LeastLoaded().place("new", owners) == "gpu1"  # three background turns weigh less than one foreground
    tied = [OwnerLoad("gpu1", 2, 2), OwnerLoad("gpu0", 2, 2)]
    assert LeastLoaded().place("new", tied) == "gpu0"  # deterministic on ties


def test_router_is_sticky_and_counts_each_live_turns_effective_priority() -> None:
    router = Router({"gpu0": "m", "gpu1": "m"})
    lent = {"a": BACKGROUND}
    assert router.owner_for("a") == "gpu0"
    router.started(1, "gpu0", lambda: lent["a"])
    assert router.owner_for("b") == "gpu1"  # gpu0 carries a's turn
    router.started(2, "gpu1", lambda: BACKGROUND)
    router.started(3, "gpu1", lambda: BACKGROUND)
    lent["a"] = FOREGROUND  # a's turn inherits foreground: its owner weighs more now
    assert [(o.name, o.mass) for o in router.loads()] == [("gpu0", FOREGROUND + 1), ("gpu1", 2)]
    assert router.owner_for("c") == "gpu1"
    assert router.owner_for("a") == "gpu0"  # affinity: its KV lives there
    router.ended(1)
    assert router.loads()[0].turns == 0


def test_a_lost_owner_sends_its_agents_elsewhere_and_losing_all_is_an_error() -> None:
    router = Router({"gpu0": None, "gpu1": None})
    assert router.owner_for("a") == "gpu0"
    router.lost("gpu0")
    assert router.agents_on("gpu0") == [] and router.owner_for("a") == "gpu1"
    router.lost("gpu1")
    with pytest.raises(ConfigError, match="every GPU owner"):
        router.owner_for("a")
    with pytest.raises(ConfigError):
        Router({})


def test_pins_by_owner_and_by_model_fall_back_when_they_cannot_hold() -> None:
    pins = Pinned(owners={"pair": "gpu1"}, models={"coder": "qwen"})
    owners = [OwnerLoad("gpu0", 0, 0, "smollm"), OwnerLoad("gpu1", 50, 5, "smollm"), OwnerLoad("gpu2", 9, 1, "qwen")]
    assert pins.place("pair", owners) == "gpu1"  # pinned, however loaded
    assert pins.place("coder", owners) == "gpu2"  # the only owner serving its model
    assert pins.place("other", owners) == "gpu0"
    assert pins.place("pair", owners[:1]) == "gpu0"  # its owner is gone: the turn must run somewhere
