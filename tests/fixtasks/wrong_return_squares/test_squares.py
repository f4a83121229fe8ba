from squares import squares, cubes


def test_squares():
    assert squares([1, 2, 3]) == [1, 4, 9]


def test_cubes():
    assert cubes([2]) == [8]
