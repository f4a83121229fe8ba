import pytest

from report import low_stock
from stock import Inventory


def make():
    inv = Inventory()
    inv.add("bolt", 5)
    inv.add("nut", 2)
    inv.add("screw", 1)
    return inv


def test_remove_to_zero_unlists_the_item():
    inv = make()
    inv.remove("screw")
    assert inv.items() == ["bolt", "nut"]


def test_remove_too_many_is_an_error():
    with pytest.raises(ValueError):
        make().remove("nut", 3)


def test_low_stock_includes_the_threshold():
    assert low_stock(make(), 2) == ["nut", "screw"]


def test_low_stock_after_selling_out():
    inv = make()
    inv.remove("screw")
    assert low_stock(inv, 2) == ["nut"]
