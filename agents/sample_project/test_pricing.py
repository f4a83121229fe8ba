import pytest

from pricing import discount, final_price, tax


def test_gold_customers_get_twenty_percent_off():
    assert discount(100, "gold") == pytest.approx(80)


def test_tax_in_france():
    assert tax(100, "FR") == pytest.approx(120)


def test_a_country_without_a_rate_pays_no_tax():
    assert tax(100, "JP") == pytest.approx(100)


def test_final_price_rounds_to_cents():
    assert final_price(9.99, "silver", "DE") == 10.7
