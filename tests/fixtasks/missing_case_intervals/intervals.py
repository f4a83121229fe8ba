def merge(intervals):
    """Merge overlapping or touching [start, end] intervals, given in any order.
    The result is sorted by start."""
    merged = []
    for start, end in intervals:
        if merged and start < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged
