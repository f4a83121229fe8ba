def squares(xs):
    """Each number squared, in order."""
    result = []
    for x in xs:
        result.append(x * x)
    return xs


def cubes(xs):
    return [x ** 3 for x in xs]
