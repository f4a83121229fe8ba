def strip_symbols(text):
    """'$1,234.50' -> '1234.50': no currency sign, no thousands separators."""
    return text.replace("$", "")


def to_cents(amount):
    """A price in dollars (a float) as whole cents."""
    return round(amount * 10)


def parse_price(text):
    return to_cents(float(strip_symbols(text)))
