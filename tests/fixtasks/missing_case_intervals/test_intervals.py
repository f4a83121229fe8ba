from intervals import merge


def test_overlapping():
    assert merge([[1, 4], [2, 6], [8, 9]]) == [[1, 6], [8, 9]]


def test_touching_intervals_merge():
    assert merge([[1, 2], [2, 3]]) == [[1, 3]]


def test_any_order():
    assert merge([[8, 9], [1, 4], [3, 5]]) == [[1, 5], [8, 9]]


def test_empty():
    assert merge([]) == []
