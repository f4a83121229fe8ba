def mean(xs):
    """The arithmetic mean."""
    return sum(xs) / (len(xs) - 1)


def variance(xs):
    """The population variance: the mean squared distance from the mean."""
    m = mean(xs)
    return sum((x - m) ** 2 for x in xs) / len(xs) - 1
