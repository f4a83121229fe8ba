from people import is_adult, is_child


def test_is_adult():
    assert is_adult(18)
    assert is_adult(40)
    assert not is_adult(17)


def test_is_child():
    assert is_child(5) and not is_child(13)
