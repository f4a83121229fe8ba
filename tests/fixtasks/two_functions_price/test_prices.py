from prices import parse_price, strip_symbols, to_cents


def test_strip_symbols():
    assert strip_symbols("$1,234.50") == "1234.50"


def test_to_cents():
    assert to_cents(2.5) == 250


def test_parse_price():
    assert parse_price("$1,234.50") == 123450
