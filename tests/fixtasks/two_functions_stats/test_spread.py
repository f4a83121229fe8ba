import pytest

from spread import mean, variance


def test_mean():
    assert mean([1, 2, 3]) == pytest.approx(2)


def test_variance():
    assert variance([1, 2, 3]) == pytest.approx(2 / 3)
    assert variance([5, 5]) == pytest.approx(0)
