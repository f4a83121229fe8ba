def discount(price, customer):
    if customer == "gold":
        return price * 0.8
    elif customer == "silver":
        return price * 0.9
    elif customer == "bronze":
        return price * 0.95
    else:
        return price


def tax(price, country):
    rates = {"FR": 0.2, "DE": 0.19, "US": 0.0}
    return price * (1 + rates[country])


def final_price(price, customer, country):
    p = discount(price, customer)
    p = tax(p, country)
    return round(p, 2)
