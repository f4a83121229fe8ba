from counting import total_upto, count_even


def test_total_upto():
    assert total_upto(3) == 6
    assert total_upto(1) == 1


def test_count_even():
    assert count_even(5) == 2
