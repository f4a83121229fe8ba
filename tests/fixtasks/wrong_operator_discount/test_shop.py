import pytest

from shop import apply_discount, add_tax


def test_apply_discount():
    assert apply_discount(200, 10) == pytest.approx(180)
    assert apply_discount(50, 0) == pytest.approx(50)


def test_add_tax():
    assert add_tax(10) == pytest.approx(12)
