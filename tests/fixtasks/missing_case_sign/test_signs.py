from signs import sign, absolute


def test_sign():
    assert sign(5) == 1
    assert sign(-2) == -1
    assert sign(0) == 0


def test_absolute():
    assert absolute(-3) == 3
