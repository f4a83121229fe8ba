def lower_bound(xs, x):
    """The first index i of sorted xs with xs[i] >= x; len(xs) if there is none."""
    lo, hi = 0, len(xs) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if xs[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def count_between(xs, low, high):
    """How many values of sorted xs lie in [low, high)."""
    return lower_bound(xs, high) - lower_bound(xs, low)
