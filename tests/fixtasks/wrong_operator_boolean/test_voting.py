from voting import can_vote, can_drive


def test_can_vote():
    assert can_vote(30, True)
    assert not can_vote(30, False)
    assert not can_vote(12, True)


def test_can_drive():
    assert can_drive(17)
