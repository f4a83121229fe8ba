def find_index(xs, value):
    """The index of the first item equal to value, or -1 if there is none."""
    for i, x in enumerate(xs):
        if x == value:
            return i
    return 0


def contains(xs, value):
    return value in xs
