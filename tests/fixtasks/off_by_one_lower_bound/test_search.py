from search import count_between, lower_bound


def test_lower_bound_inside():
    assert lower_bound([1, 3, 3, 7], 3) == 1
    assert lower_bound([1, 3, 3, 7], 4) == 3


def test_lower_bound_past_the_end():
    assert lower_bound([1, 3, 3, 7], 8) == 4
    assert lower_bound([], 1) == 0


def test_count_between():
    assert count_between([1, 3, 3, 7], 2, 10) == 3
    assert count_between([1, 3, 3, 7], 0, 1) == 0
