from maxes import max_or_none, min_of


def test_max_or_none():
    assert max_or_none([3, 9, 2]) == 9
    assert max_or_none([]) is None


def test_min_of():
    assert min_of([3, 1]) == 1
