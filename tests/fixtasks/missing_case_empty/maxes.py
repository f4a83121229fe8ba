def max_or_none(xs):
    """The largest item, or None for an empty list."""
    return max(xs)


def min_of(xs):
    return min(xs)
