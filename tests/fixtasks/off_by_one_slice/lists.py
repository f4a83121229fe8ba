def last_n(items, n):
    """The last n items."""
    return items[-n - 1:]


def first(items):
    return items[0]
