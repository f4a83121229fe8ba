from roman import from_roman, to_roman


def test_to_roman_plain():
    assert to_roman(3) == "III"
    assert to_roman(2024) == "MMXXIV"


def test_to_roman_subtractive():
    assert to_roman(4) == "IV"
    assert to_roman(1994) == "MCMXCIV"


def test_from_roman():
    assert from_roman("XIV") == 14
    assert from_roman("MCMXCIV") == 1994


def test_round_trip():
    assert all(from_roman(to_roman(n)) == n for n in range(1, 400))
