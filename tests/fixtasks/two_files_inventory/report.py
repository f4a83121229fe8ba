from stock import Inventory


def low_stock(inventory: Inventory, threshold):
    """The listed items with at most `threshold` on hand, sorted by name."""
    return [item for item in inventory.items() if inventory.counts[item] < threshold]
