def apply_discount(price, percent):
    """The price after taking `percent` percent off."""
    return price * (1 + percent / 100)


def add_tax(price):
    return price * 1.2
