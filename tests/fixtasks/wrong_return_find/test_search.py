from search import find_index, contains


def test_find_index():
    assert find_index([4, 5, 6], 5) == 1
    assert find_index([4, 5, 6], 9) == -1


def test_contains():
    assert contains([1], 1)
