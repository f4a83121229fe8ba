def sign(x):
    """1 for a positive number, -1 for a negative one, 0 for zero."""
    if x > 0:
        return 1
    return -1


def absolute(x):
    return x * sign(x)
