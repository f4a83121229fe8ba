import pytest

from inventory import Inventory


def test_add_merges_quantities():
    inv = Inventory()
    inv.add("apple", 3, 0.5)
    inv.add("apple", 2, 0.5)
    assert inv.items["apple"]["qty"] == 5


def test_remove_all_of_an_item_deletes_it():
    inv = Inventory()
    inv.add("pear", 2, 0.75)
    inv.remove("pear", 2)
    assert "pear" not in inv.items


def test_remove_more_than_stock_is_refused():
    inv = Inventory()
    inv.add("pear", 2, 0.75)
    with pytest.raises(ValueError):
        inv.remove("pear", 3)


def test_total_is_quantity_times_price():
    inv = Inventory()
    inv.add("apple", 3, 0.5)
    inv.add("pear", 2, 0.75)
    assert inv.total() == pytest.approx(3.0)
