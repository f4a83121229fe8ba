from inventory import Inventory
from pricing import final_price


def report(inv: Inventory, customer="none", country="US"):
    lines = []
    for name in inv.items:
        item = inv.items[name]
        lines.append(name + ": " + str(item["qty"]) + " x " + str(final_price(item["price"], customer, country)))
    lines.append("total: " + str(inv.total()))
    return "\n".join(lines)


def main():
    inv = Inventory()
    inv.add("apple", 3, 0.5)
    inv.add("pear", 2, 0.75)
    print(report(inv, "gold", "FR"))


if __name__ == "__main__":
    main()
