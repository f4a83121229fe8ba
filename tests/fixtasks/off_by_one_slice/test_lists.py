from lists import last_n, first


def test_last_n():
    assert last_n([1, 2, 3, 4], 2) == [3, 4]
    assert last_n([1, 2, 3], 1) == [3]


def test_first():
    assert first([5, 6]) == 5
