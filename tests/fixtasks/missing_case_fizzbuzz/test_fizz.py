from fizz import fizzbuzz


def test_fizz_and_buzz():
    assert fizzbuzz(3) == "Fizz"
    assert fizzbuzz(10) == "Buzz"
    assert fizzbuzz(7) == "7"


def test_fizzbuzz():
    assert fizzbuzz(15) == "FizzBuzz"
    assert fizzbuzz(30) == "FizzBuzz"
