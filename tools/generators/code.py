"""Builds the code set: small Python function tasks whose unit tests come from a reference solution.

Each task is a one-sentence request, a canonical solution and a handful of inputs; the expected
outputs are computed by running the canonical solution here, so a test can never disagree with
it. The original sixty come first, in their order; the others follow with their four kinds
(numbers, text, lists, mappings) taken in turn, so a longer `limit` adds a mix, not one kind.
`python -m tools.generators.code` rewrites `evalsets/code/data.jsonl` identically.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalsets.jsonl import write_jsonl
from tools.generators import set_folder

DATA_PATH = set_folder("code") / "data.jsonl"


@dataclass(frozen=True)
class Task:
    signature: str  # "add(a, b)"
    does: str  # completes "Write a Python function `add(a, b)` that ..."
    solution: str  # the canonical solution's body, indented by 4
    cases: tuple[tuple[Any, ...], ...]  # argument tuples; the first one is the prompt's example

    @property
    def entry_point(self) -> str:
        return self.signature.split("(", 1)[0]


def _t(signature: str, does: str, body: str, *cases: tuple[Any, ...]) -> Task:
    return Task(signature, does, body, cases)


# The original sixty, easiest first.
FIRST_TASKS: list[Task] = [
    _t("add(a, b)", "returns the sum of a and b", "return a + b", (2, 3), (-4, 10), (0, 0), (125, 75)),
    _t("subtract(a, b)", "returns a minus b", "return a - b", (9, 4), (3, 10), (0, 0), (-5, -5)),
    _t("multiply(a, b)", "returns a times b", "return a * b", (3, 4), (-2, 8), (0, 7), (12, 12)),
    _t("square(n)", "returns n squared", "return n * n", (4,), (-3,), (0,), (11,)),
    _t("cube(n)", "returns n cubed", "return n ** 3", (2,), (-3,), (0,), (5,)),
    _t("is_even(n)", "returns True if n is even, otherwise False", "return n % 2 == 0",
       (4,), (7,), (0,), (-2,), (13,)),
    _t("is_odd(n)", "returns True if n is odd, otherwise False", "return n % 2 != 0",
       (3,), (8,), (0,), (-5,)),
    _t("absolute(n)", "returns the absolute value of n", "return n if n >= 0 else -n",
       (-7,), (5,), (0,), (-120,)),
    _t("max_of_two(a, b)", "returns the larger of a and b", "return a if a >= b else b",
       (3, 9), (10, 2), (-1, -6), (4, 4)),
    _t("min_of_list(numbers)", "returns the smallest number in the list", "return min(numbers)",
       ([4, 2, 8],), ([5],), ([-1, -9, 3],), ([7, 7, 1, 7],)),
    _t("max_of_list(numbers)", "returns the largest number in the list", "return max(numbers)",
       ([4, 2, 8],), ([5],), ([-1, -9, -3],), ([0, 100, 99],)),
    _t("sum_list(numbers)", "returns the sum of the numbers in the list", "return sum(numbers)",
       ([1, 2, 3],), ([],), ([-5, 5, 10],), ([100],)),
    _t("average(numbers)", "returns the average (mean) of the numbers in the list",
       "return sum(numbers) / len(numbers)", ([1, 2, 3],), ([4],), ([2, 4, 6, 8],), ([-1, 1],)),
    _t("count_items(items)", "returns how many items the list has", "return len(items)",
       (["a", "b", "c"],), ([],), ([1, 1, 1, 1, 1],)),
    _t("reverse_string(s)", "returns the string s reversed", "return s[::-1]",
       ("abc",), ("hello",), ("",), ("racecar",)),
    _t("to_upper(s)", "returns s in upper case", "return s.upper()",
       ("hello",), ("Mixed Case",), ("",), ("abc123",)),
    _t("first_char(s)", "returns the first character of the string s", "return s[0]",
       ("hello",), ("a",), ("Zebra",)),
    _t("last_element(items)", "returns the last element of the list", "return items[-1]",
       ([1, 2, 3],), (["x"],), ([None, 0, "end"],)),
    _t("string_length(s)", "returns the number of characters in s", "return len(s)",
       ("hello",), ("",), ("a b c",)),
    _t("concat(a, b)", "returns the strings a and b joined together", "return a + b",
       ("foo", "bar"), ("", "x"), ("ab", "")),
    _t("is_palindrome(s)", "returns True if the string s reads the same backwards, otherwise False",
       "return s == s[::-1]", ("level",), ("hello",), ("",), ("abba",), ("ab",)),
    _t("count_vowels(s)", "returns the number of vowels (a, e, i, o, u) in the lowercase string s",
       "return sum(1 for ch in s if ch in 'aeiou')", ("hello",), ("sky",), ("aeiou",), ("banana",)),
    _t("factorial(n)", "returns n factorial (n!)",
       "result = 1\n    for k in range(2, n + 1):\n        result *= k\n    return result",
       (5,), (0,), (1,), (10,)),
    _t("fibonacci(n)", "returns the n-th Fibonacci number, where fibonacci(0) is 0 and fibonacci(1) is 1",
       "a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
       (6,), (0,), (1,), (10,), (20,)),
    _t("is_prime(n)", "returns True if n is a prime number, otherwise False",
       "if n < 2:\n        return False\n    return all(n % k for k in range(2, int(n ** 0.5) + 1))",
       (7,), (1,), (2,), (9,), (97,), (100,)),
    _t("gcd(a, b)", "returns the greatest common divisor of the positive integers a and b",
       "while b:\n        a, b = b, a % b\n    return a", (12, 18), (7, 5), (100, 10), (21, 14)),
    _t("celsius_to_fahrenheit(c)", "converts c degrees Celsius to Fahrenheit",
       "return c * 9 / 5 + 32", (100,), (0,), (-40,), (37,)),
    _t("double_list(numbers)", "returns a new list with every number doubled",
       "return [2 * x for x in numbers]", ([1, 2, 3],), ([],), ([-1, 0, 5],)),
    _t("filter_even(numbers)", "returns a list of only the even numbers, in order",
       "return [x for x in numbers if x % 2 == 0]", ([1, 2, 3, 4],), ([1, 3],), ([0, -2, 7, 8],)),
    _t("count_words(s)", "returns the number of words in s (words are separated by spaces)",
       "return len(s.split())", ("hello world",), ("one",), ("",), ("a b  c d",)),
    _t("capitalize_words(s)", "returns s with the first letter of every word in upper case",
       "return ' '.join(w.capitalize() for w in s.split(' '))",
       ("hello world",), ("python",), ("a quick test",)),
    _t("remove_spaces(s)", "returns s with all spaces removed", "return s.replace(' ', '')",
       ("a b c",), ("nospace",), ("  lead and trail  ",)),
    _t("sum_digits(n)", "returns the sum of the digits of the non-negative integer n",
       "return sum(int(d) for d in str(n))", (123,), (0,), (9999,), (405,)),
    _t("reverse_list(items)", "returns the list in reverse order", "return items[::-1]",
       ([1, 2, 3],), ([],), (["a", "b"],)),
    _t("contains(items, x)", "returns True if x is in the list items, otherwise False",
       "return x in items", ([1, 2, 3], 2), ([1, 2, 3], 5), ([], 1), (["a"], "a")),
    _t("index_of(items, x)", "returns the index of x in the list, or -1 if x is not there",
       "return items.index(x) if x in items else -1",
       ([5, 6, 7], 7), ([5, 6, 7], 9), ([], 1), ([3, 3], 3)),
    _t("unique(items)", "returns the list without duplicates, keeping the first occurrence order",
       "seen = []\n    for x in items:\n        if x not in seen:\n            seen.append(x)\n"
       "    return seen",
       ([1, 2, 2, 3, 1],), ([],), (["b", "a", "b"],)),
    _t("sort_list(numbers)", "returns the numbers sorted from smallest to largest",
       "return sorted(numbers)", ([3, 1, 2],), ([],), ([5, -1, 5, 0],)),
    _t("second_largest(numbers)", "returns the second largest distinct number in the list",
       "return sorted(set(numbers))[-2]", ([1, 5, 3],), ([10, 10, 9],), ([-1, -2, -3],)),
    _t("count_char(s, c)", "returns how many times the character c appears in s", "return s.count(c)",
       ("banana", "a"), ("hello", "z"), ("", "x"), ("aaa", "a")),
    _t("repeat_string(s, n)", "returns s repeated n times", "return s * n",
       ("ab", 3), ("x", 0), ("hi", 1)),
    _t("is_leap_year(year)", "returns True if year is a leap year in the Gregorian calendar",
       "return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)",
       (2024,), (2023,), (1900,), (2000,)),
    _t("power(base, exp)", "returns base raised to the power exp", "return base ** exp",
       (2, 10), (5, 0), (3, 3), (-2, 3)),
    _t("clamp(x, low, high)", "returns x limited to the range from low to high",
       "return max(low, min(x, high))", (5, 0, 10), (-3, 0, 10), (42, 0, 10), (0, 0, 0)),
    _t("sign(n)", "returns 1 if n is positive, -1 if n is negative and 0 if n is zero",
       "return (n > 0) - (n < 0)", (5,), (-3,), (0,)),
    _t("list_product(numbers)", "returns the product of all numbers in the list (1 for an empty list)",
       "result = 1\n    for x in numbers:\n        result *= x\n    return result",
       ([2, 3, 4],), ([],), ([5, 0, 2],), ([-1, 7],)),
    _t("count_positive(numbers)", "returns how many numbers in the list are greater than zero",
       "return sum(1 for x in numbers if x > 0)", ([1, -2, 3],), ([],), ([0, -1],)),
    _t("merge_lists(a, b)", "returns a new list with the elements of a followed by those of b",
       "return a + b", ([1, 2], [3]), ([], []), (["x"], ["y", "z"])),
    _t("sorted_keys(d)", "returns the keys of the dictionary d as a sorted list", "return sorted(d)",
       ({"b": 1, "a": 2},), ({},), ({"z": 0, "m": 0, "c": 0},)),
    _t("word_lengths(s)", "returns a list with the length of each word in s (split on spaces)",
       "return [len(w) for w in s.split()]", ("hello big world",), ("",), ("a bb ccc",)),
    _t("is_sorted(numbers)", "returns True if the list is sorted from smallest to largest",
       "return all(a <= b for a, b in zip(numbers, numbers[1:]))",
       ([1, 2, 3],), ([3, 1],), ([],), ([2, 2, 5],)),
    _t("char_frequency(s)", "returns a dictionary mapping each character of s to how often it appears",
       "counts = {}\n    for ch in s:\n        counts[ch] = counts.get(ch, 0) + 1\n    return counts",
       ("aab",), ("",), ("hello",)),
    _t("flatten(lists)", "returns one list with the elements of all the inner lists, in order",
       "return [x for inner in lists for x in inner]", ([[1, 2], [3]],), ([],), ([[], ["a"], [], ["b"]],)),
    _t("numbers_up_to(n)", "returns a list of the numbers from 1 to n", "return list(range(1, n + 1))",
       (3,), (0,), (1,), (6,)),
    _t("starts_with_vowel(s)", "returns True if the word s starts with a vowel (a, e, i, o, u)",
       "return s[:1].lower() in ('a', 'e', 'i', 'o', 'u') and s != ''",
       ("apple",), ("banana",), ("Orange",), ("",)),
    _t("percent(part, whole)", "returns what percent part is of whole",
       "return part / whole * 100", (1, 4), (50, 200), (3, 3), (0, 9)),
    _t("fizzbuzz(n)", "returns 'Fizz' if n is divisible by 3, 'Buzz' if by 5, 'FizzBuzz' if by both, "
       "otherwise str(n)",
       "if n % 15 == 0:\n        return 'FizzBuzz'\n    if n % 3 == 0:\n        return 'Fizz'\n"
       "    if n % 5 == 0:\n        return 'Buzz'\n    return str(n)",
       (15,), (9,), (10,), (7,)),
    _t("to_binary(n)", "returns the binary representation of the non-negative integer n as a string "
       "without a prefix", "return bin(n)[2:]", (5,), (0,), (8,), (255,)),
    _t("format_minutes(minutes)", "returns the minutes as a string 'H:MM' of hours and minutes",
       "return f'{minutes // 60}:{minutes % 60:02d}'", (125,), (0,), (59,), (600,)),
    _t("vowel_positions(s)", "returns the list of indexes of the vowels (a, e, i, o, u) in s",
       "return [i for i, ch in enumerate(s) if ch in 'aeiou']", ("hello",), ("",), ("aei",)),
]

# Ninety-odd more tasks in four kinds, each list mixing one-liners with loops; TASKS takes them
# in turn (a number task, a text task, a list task, a mapping task, ...) after the first 60.
NUMBER_TASKS: list[Task] = [
    _t("is_multiple(n, k)", "returns True if n is a multiple of k, otherwise False", "return n % k == 0",
       (10, 5), (7, 3), (0, 4), (-9, 3)),
    _t("lcm(a, b)", "returns the least common multiple of the positive integers a and b",
       "x, y = a, b\n    while y:\n        x, y = y, x % y\n    return a * b // x",
       (4, 6), (3, 5), (12, 18), (7, 7)),
    _t("digit_count(n)", "returns how many digits the non-negative integer n has", "return len(str(n))",
       (12345,), (0,), (9,), (1000,)),
    _t("collatz_steps(n)", "returns how many steps the Collatz rule (halve an even number, replace an "
       "odd one by 3 * n + 1) takes to bring the positive integer n down to 1",
       "steps = 0\n    while n != 1:\n        n = n // 2 if n % 2 == 0 else 3 * n + 1\n"
       "        steps += 1\n    return steps",
       (6,), (1,), (7,), (27,)),
    _t("difference(a, b)", "returns the absolute difference between a and b", "return abs(a - b)",
       (3, 8), (10, 2), (-4, 4), (5, 5)),
    _t("is_perfect_square(n)", "returns True if the non-negative integer n is the square of an integer",
       "root = 0\n    while (root + 1) * (root + 1) <= n:\n        root += 1\n    return root * root == n",
       (16,), (15,), (0,), (1,), (50,), (49,)),
    _t("max_of_three(a, b, c)", "returns the largest of a, b and c", "return max(a, b, c)",
       (1, 5, 3), (9, 2, 9), (-1, -5, -3), (0, 0, 0)),
    _t("count_divisors(n)", "returns how many positive divisors the positive integer n has",
       "return sum(1 for k in range(1, n + 1) if n % k == 0)", (12,), (1,), (7,), (36,)),
    _t("triangular_number(n)", "returns the sum 1 + 2 + ... + n (0 when n is 0)",
       "return n * (n + 1) // 2", (4,), (0,), (1,), (100,)),
    _t("digital_root(n)", "returns the digital root of the non-negative integer n: keep summing its "
       "digits until one digit is left",
       "while n >= 10:\n        n = sum(int(d) for d in str(n))\n    return n",
       (38,), (0,), (9875,), (5,)),
    _t("is_between(x, low, high)", "returns True if low <= x <= high, otherwise False",
       "return low <= x <= high", (5, 1, 10), (0, 1, 10), (10, 1, 10), (11, 1, 10)),
    _t("count_primes(n)", "returns how many prime numbers are smaller than n",
       "count = 0\n    for k in range(2, n):\n        if all(k % d for d in range(2, int(k ** 0.5) + 1)):\n"
       "            count += 1\n    return count",
       (10,), (2,), (3,), (30,)),
    _t("round_down_to_ten(n)", "returns the non-negative integer n rounded down to a multiple of ten",
       "return n - n % 10", (47,), (40,), (3,), (999,)),
    _t("reverse_number(n)", "returns the non-negative integer n with its digits in reverse order, as "
       "an integer", "return int(str(n)[::-1])", (123,), (120,), (5,), (9001,)),
    _t("sum_of_squares(n)", "returns 1 * 1 + 2 * 2 + ... + n * n (0 when n is 0)",
       "return sum(k * k for k in range(1, n + 1))", (3,), (0,), (1,), (10,)),
    _t("is_power_of_two(n)", "returns True if the integer n is a power of two (1, 2, 4, 8, ...)",
       "return n > 0 and n & (n - 1) == 0", (8,), (6,), (1,), (0,), (1024,)),
    _t("midpoint(a, b)", "returns the number halfway between a and b", "return (a + b) / 2",
       (2, 4), (0, 5), (-3, 3)),
    _t("is_coprime(a, b)", "returns True if the positive integers a and b have no common divisor "
       "other than 1", "while b:\n        a, b = b, a % b\n    return a == 1",
       (8, 9), (6, 9), (1, 1), (14, 21)),
    _t("from_binary(s)", "returns the integer that the string s of binary digits stands for",
       "return int(s, 2)", ("101",), ("0",), ("11111111",), ("1000",)),
    _t("sum_even_up_to(n)", "returns the sum of the even numbers from 0 to n, n included",
       "return sum(range(0, n + 1, 2))", (6,), (7,), (0,), (10,)),
    _t("count_even_digits(n)", "returns how many digits of the non-negative integer n are even",
       "return sum(1 for d in str(n) if int(d) % 2 == 0)", (1234,), (0,), (13579,), (2468,)),
    _t("next_multiple(n, k)", "returns the smallest multiple of the positive integer k that is greater "
       "than or equal to the non-negative integer n", "return -(-n // k) * k",
       (7, 5), (10, 5), (1, 3), (0, 4)),
    _t("hours_to_seconds(hours)", "returns how many seconds there are in the given number of hours",
       "return hours * 3600", (1,), (0,), (2.5,)),
    _t("triangle_area(base, height)", "returns the area of a triangle with the given base and height",
       "return base * height / 2", (4, 3), (5, 5), (0, 7)),
]

TEXT_TASKS: list[Task] = [
    _t("to_lower(s)", "returns s in lower case", "return s.lower()", ("HeLLo",), ("",), ("ABC123",)),
    _t("initials(name)", "returns the upper-case first letter of every word of name, joined together",
       "return ''.join(w[0].upper() for w in name.split())",
       ("ada lovelace",), ("Grace Brewster Hopper",), ("x",)),
    _t("caesar_shift(s, k)", "shifts every lowercase letter of s k places forward in the alphabet, "
       "wrapping from z to a, and leaves every other character as it is",
       "return ''.join(chr((ord(ch) - 97 + k) % 26 + 97) if 'a' <= ch <= 'z' else ch for ch in s)",
       ("abc", 1), ("xyz", 3), ("hello world", 0), ("a-b", 25)),
    _t("last_char(s)", "returns the last character of the string s", "return s[-1]",
       ("hello",), ("a",), ("xyz",)),
    _t("count_uppercase(s)", "returns how many upper-case letters s has",
       "return sum(1 for ch in s if ch.isupper())", ("Hello World",), ("",), ("ABC",), ("abc",)),
    _t("run_length_encode(s)", "returns the run-length encoding of s: each run of the same character "
       "becomes the character followed by the run's length, so 'aaab' becomes 'a3b1'",
       "out = ''\n    i = 0\n    while i < len(s):\n        j = i\n"
       "        while j < len(s) and s[j] == s[i]:\n            j += 1\n"
       "        out += s[i] + str(j - i)\n        i = j\n    return out",
       ("aaabcc",), ("",), ("abc",), ("zzzz",)),
    _t("only_digits(s)", "returns True if s is not empty and every character of s is a digit",
       "return s.isdigit()", ("12345",), ("12a",), ("",), ("007",)),
    _t("remove_vowels(s)", "returns s without its vowels (a, e, i, o, u, in either case)",
       "return ''.join(ch for ch in s if ch.lower() not in 'aeiou')",
       ("hello",), ("AEIOU",), ("sky",), ("Banana",)),
    _t("is_anagram(a, b)", "returns True if the strings a and b contain the same characters the same "
       "number of times", "return sorted(a) == sorted(b)",
       ("listen", "silent"), ("abc", "abd"), ("", ""), ("aab", "abb")),
    _t("swap_case(s)", "returns s with upper-case letters made lower case and lower-case letters upper "
       "case", "return s.swapcase()", ("Hello",), ("",), ("aBc1",)),
    _t("reverse_words(s)", "returns the words of s (separated by spaces) in reverse order, joined by "
       "single spaces", "return ' '.join(s.split()[::-1])",
       ("hello big world",), ("one",), ("",)),
    _t("snake_to_camel(s)", "turns a snake_case name into camelCase, e.g. 'get_user_id' into "
       "'getUserId'",
       "first, *rest = s.split('_')\n    return first + ''.join(w.capitalize() for w in rest)",
       ("hello_world",), ("one",), ("get_user_id",)),
    _t("longest_word(s)", "returns the longest word of s (words are separated by spaces; the first one "
       "if several are equally long)", "return max(s.split(), key=len)",
       ("a quick brown fox",), ("hi",), ("one three seven",), ("ab cd",)),
    _t("zero_pad(n, width)", "returns the non-negative integer n as a string, with leading zeros added "
       "until it is at least width characters long", "return str(n).zfill(width)",
       (7, 3), (1234, 2), (0, 1), (42, 5)),
    _t("is_pangram(s)", "returns True if s contains every letter from a to z at least once, in either "
       "case", "return set('abcdefghijklmnopqrstuvwxyz') <= set(s.lower())",
       ("The quick brown fox jumps over the lazy dog",), ("hello",), ("",)),
    _t("count_substring(s, sub)", "returns how many non-overlapping times sub occurs in s",
       "return s.count(sub)", ("banana", "an"), ("aaaa", "aa"), ("abc", "x")),
    _t("double_chars(s)", "returns s with every character written twice",
       "return ''.join(ch * 2 for ch in s)",
       ("abc",), ("",), ("a b",)),
    _t("camel_to_snake(s)", "turns a camelCase name into snake_case, e.g. 'getUserId' into 'get_user_id'",
       "return ''.join('_' + ch.lower() if ch.isupper() else ch for ch in s)",
       ("helloWorld",), ("getUserId",), ("simple",)),
    _t("first_word(s)", "returns the first word of s (words are separated by spaces)",
       "return s.split()[0]", ("hello world",), ("single",), ("  padded text",)),
    _t("remove_digits(s)", "returns s without its digits",
       "return ''.join(ch for ch in s if not ch.isdigit())",
       ("a1b2c3",), ("2024",), ("no digits",)),
    _t("truncate(s, n)", "returns s unchanged if it has at most n characters, otherwise its first n "
       "characters followed by '...'", "return s if len(s) <= n else s[:n] + '...'",
       ("hello world", 5), ("hi", 5), ("abcdef", 6)),
    _t("mask(s)", "returns s with every character except the last four replaced by '*'",
       "return '*' * max(0, len(s) - 4) + s[-4:]", ("1234567890",), ("abcd",), ("12",)),
    _t("most_common_char(s)", "returns the character that appears most often in the non-empty string s "
       "(the one that comes first in s if several appear equally often)", "return max(s, key=s.count)",
       ("banana",), ("abc",), ("mississippi",)),
    _t("is_rotation(a, b)", "returns True if the string b is a rotation of the string a (like 'cdab' of "
       "'abcd')", "return len(a) == len(b) and b in a + a",
       ("waterbottle", "erbottlewat"), ("abc", "acb"), ("", ""), ("ab", "abc")),
    _t("normalize_spaces(s)", "returns s with leading and trailing spaces removed and every run of "
       "spaces inside it replaced by one space", "return ' '.join(s.split())",
       ("  hello   world ",), ("a",), ("",)),
    _t("ends_with(s, suffix)", "returns True if the string s ends with suffix, otherwise False",
       "return s.endswith(suffix)", ("hello.py", ".py"), ("hello.txt", ".py"), ("", "")),
]

LIST_TASKS: list[Task] = [
    _t("sum_of_evens(numbers)", "returns the sum of the even numbers in the list",
       "return sum(x for x in numbers if x % 2 == 0)", ([1, 2, 3, 4],), ([],), ([1, 3],), ([-2, 5, 8],)),
    _t("running_total(numbers)", "returns a list whose i-th element is the sum of the first i + 1 numbers",
       "total = 0\n    result = []\n    for x in numbers:\n        total += x\n        result.append(total)\n"
       "    return result",
       ([1, 2, 3],), ([],), ([5, -5, 5],)),
    _t("count_occurrences(items, x)", "returns how many times x appears in the list items",
       "return items.count(x)", ([1, 2, 1, 3, 1], 1), ([], 5), (["a", "b"], "b")),
    _t("binary_search(numbers, target)", "returns the index of target in the sorted list of distinct "
       "numbers using binary search, or -1 if target is not there",
       "low, high = 0, len(numbers) - 1\n    while low <= high:\n        mid = (low + high) // 2\n"
       "        if numbers[mid] == target:\n            return mid\n        if numbers[mid] < target:\n"
       "            low = mid + 1\n        else:\n            high = mid - 1\n    return -1",
       ([1, 3, 5, 7, 9], 7), ([1, 3, 5], 4), ([], 1), ([2], 2), ([1, 3, 5, 7], 1)),
    _t("first_n(items, n)", "returns the first n elements of the list (all of them if it is shorter)",
       "return items[:n]", ([1, 2, 3, 4], 2), ([1], 3), ([], 0)),
    _t("remove_all(items, x)", "returns a new list with every occurrence of x removed",
       "return [y for y in items if y != x]", ([1, 2, 1, 3], 1), ([], 1), (["a", "b"], "c")),
    _t("chunk(items, size)", "splits the list into consecutive chunks of size elements (the last one may "
       "be shorter) and returns the list of chunks",
       "return [items[i:i + size] for i in range(0, len(items), size)]",
       ([1, 2, 3, 4, 5], 2), ([], 3), ([1, 2, 3], 3)),
    _t("add_lists(a, b)", "returns a list of the sums of the elements at the same positions of the "
       "equally long lists a and b", "return [x + y for x, y in zip(a, b)]",
       ([1, 2], [3, 4]), ([], []), ([-1, 0, 1], [1, 0, -1])),
    _t("rotate_left(items, k)", "returns the list rotated k positions to the left (k may be larger than "
       "the list's length)",
       "if not items:\n        return []\n    k %= len(items)\n    return items[k:] + items[:k]",
       ([1, 2, 3, 4], 1), ([1, 2, 3], 5), ([], 2), (["a"], 0)),
    _t("min_max(numbers)", "returns a tuple (smallest, largest) of the non-empty list of numbers",
       "return (min(numbers), max(numbers))", ([3, 1, 9],), ([5],), ([-2, -8, 0],)),
    _t("deep_sum(items)", "returns the sum of all the numbers in a list whose elements are numbers or "
       "lists of the same kind, nested to any depth",
       "total = 0\n    for x in items:\n        total += deep_sum(x) if isinstance(x, list) else x\n"
       "    return total",
       ([1, [2, 3], [[4]]],), ([],), ([[], [1]],), ([5, [-5, [10]]],)),
    _t("spread(numbers)", "returns the largest number of the non-empty list minus its smallest",
       "return max(numbers) - min(numbers)", ([3, 1, 9],), ([5],), ([-2, -8, 0],)),
    _t("count_greater(numbers, threshold)", "returns how many numbers in the list are greater than "
       "threshold", "return sum(1 for x in numbers if x > threshold)",
       ([1, 5, 10], 4), ([], 0), ([3, 3], 3)),
    _t("interleave(a, b)", "returns a list that takes elements from the lists a and b in turn, starting "
       "with a; when one list runs out the rest of the other follows",
       "result = []\n    for i in range(max(len(a), len(b))):\n        if i < len(a):\n"
       "            result.append(a[i])\n        if i < len(b):\n            result.append(b[i])\n"
       "    return result",
       ([1, 2, 3], ["a", "b"]), ([], [1]), ([1], [])),
    _t("has_duplicates(items)", "returns True if some value appears more than once in the list",
       "return len(set(items)) != len(items)", ([1, 2, 3],), ([1, 2, 1],), ([],), (["a", "a"],)),
    _t("differences(numbers)", "returns the list of differences between consecutive numbers (each "
       "number minus the one before it)", "return [b - a for a, b in zip(numbers, numbers[1:])]",
       ([1, 4, 9],), ([5],), ([3, 1, 2],)),
    _t("has_pair_with_sum(numbers, target)", "returns True if two numbers at different positions in the "
       "list add up to target",
       "seen = set()\n    for x in numbers:\n        if target - x in seen:\n            return True\n"
       "        seen.add(x)\n    return False",
       ([1, 4, 6], 10), ([5], 10), ([5, 5], 10), ([1, 2, 3], 7)),
    _t("absolute_values(numbers)", "returns a list of the absolute values of the numbers",
       "return [abs(x) for x in numbers]", ([-1, 2, -3],), ([],), ([0],)),
    _t("transpose(matrix)", "returns the transpose of a matrix given as a list of equally long rows",
       "return [list(row) for row in zip(*matrix)]", ([[1, 2], [3, 4]],), ([[1, 2, 3]],), ([],)),
    _t("most_frequent(items)", "returns the value that appears most often in the non-empty list (the one "
       "that comes first in the list if several appear equally often)", "return max(items, key=items.count)",
       ([1, 2, 2, 3],), (["a"],), ([3, 1, 3, 1],)),
    _t("merge_sorted(a, b)", "merges the two sorted lists a and b into one sorted list",
       "return sorted(a + b)", ([1, 4, 9], [2, 3, 10]), ([], [1]), ([1, 1], [1])),
    _t("split_even_odd(numbers)", "returns a tuple of two lists: the even numbers and the odd numbers, "
       "each in their original order",
       "return ([x for x in numbers if x % 2 == 0], [x for x in numbers if x % 2 != 0])",
       ([1, 2, 3, 4],), ([],), ([7],)),
    _t("diagonal_sum(matrix)", "returns the sum of the main diagonal of a square matrix given as a list "
       "of rows", "return sum(matrix[i][i] for i in range(len(matrix)))",
       ([[1, 2], [3, 4]],), ([[7]],), ([[1, 0, 0], [0, 2, 0], [0, 0, 3]],)),
    _t("max_index(numbers)", "returns the index of the largest number in the non-empty list (the first "
       "one if it appears more than once)", "return numbers.index(max(numbers))",
       ([3, 9, 2],), ([5],), ([4, 4, 1],)),
    _t("last_n(items, n)", "returns the last n elements of the list, where n is at most its length",
       "return items[len(items) - n:]", ([1, 2, 3, 4], 2), ([1, 2], 0), ([5], 1)),
]

MAPPING_TASKS: list[Task] = [
    _t("sum_values(d)", "returns the sum of the values of the dictionary d", "return sum(d.values())",
       ({"a": 1, "b": 2},), ({},), ({"x": -5, "y": 5},)),
    _t("word_frequencies(s)", "returns a dictionary mapping each word of s (split on spaces) to how "
       "often it appears",
       "counts = {}\n    for word in s.split():\n        counts[word] = counts.get(word, 0) + 1\n"
       "    return counts",
       ("the cat the dog",), ("",), ("a a a",)),
    _t("invert_dict(d)", "returns a new dictionary with the keys and values of d swapped (the values "
       "are all different)", "return {v: k for k, v in d.items()}",
       ({"a": 1, "b": 2},), ({},), ({"x": "y"},)),
    _t("roman_to_int(s)", "returns the integer value of the Roman numeral s (like 'XIV' for 14)",
       "values = {'I': 1, 'V': 5, 'X': 10, 'L': 50, 'C': 100, 'D': 500, 'M': 1000}\n    total = 0\n"
       "    for i, ch in enumerate(s):\n        if i + 1 < len(s) and values[ch] < values[s[i + 1]]:\n"
       "            total -= values[ch]\n        else:\n            total += values[ch]\n    return total",
       ("XIV",), ("III",), ("MCMXCIV",), ("IX",)),
    _t("get_or_default(d, key, default)", "returns d[key] if key is in the dictionary d, otherwise "
       "default", "return d.get(key, default)",
       ({"a": 1}, "a", 0), ({"a": 1}, "b", 0), ({}, "x", None)),
    _t("key_with_max_value(d)", "returns the key of the non-empty dictionary d with the largest value "
       "(the first such key if several share it)", "return max(d, key=d.get)",
       ({"a": 1, "b": 5, "c": 3},), ({"x": 0},), ({"p": 2, "q": 2},)),
    _t("balanced_parentheses(s)", "returns True if every '(' in s is closed by a later ')' and every "
       "')' closes an earlier '('; other characters do not matter",
       "depth = 0\n    for ch in s:\n        if ch == '(':\n            depth += 1\n"
       "        elif ch == ')':\n            depth -= 1\n            if depth < 0:\n"
       "                return False\n    return depth == 0",
       ("(())",), ("(()",), ("",), (")(",), ("(a)(b)",)),
    _t("merge_dicts(a, b)", "returns a new dictionary with the entries of a and b; where both have a key, "
       "b's value wins", "return {**a, **b}",
       ({"a": 1}, {"b": 2}), ({"a": 1}, {"a": 3}), ({}, {})),
    _t("filter_dict(d, minimum)", "returns a new dictionary with only the entries of d whose value is at "
       "least minimum", "return {k: v for k, v in d.items() if v >= minimum}",
       ({"a": 1, "b": 5}, 3), ({}, 0), ({"x": 3}, 3)),
    _t("time_to_minutes(t)", "returns how many minutes after midnight the time t, a string 'HH:MM', is",
       "hours, minutes = t.split(':')\n    return int(hours) * 60 + int(minutes)",
       ("01:30",), ("00:00",), ("23:59",)),
    _t("group_by_length(words)", "returns a dictionary mapping each word length to the list of words of "
       "that length, in their original order",
       "groups = {}\n    for word in words:\n        groups.setdefault(len(word), []).append(word)\n"
       "    return groups",
       (["a", "bb", "cc", "d"],), ([],), (["hello"],)),
    _t("keys_sorted_by_value(d)", "returns the keys of the dictionary d as a list ordered by their values, "
       "smallest first (keys with equal values keep their order in d)", "return sorted(d, key=d.get)",
       ({"a": 3, "b": 1, "c": 2},), ({},), ({"x": 1, "y": 1},)),
    _t("days_in_month(month, year)", "returns how many days the month (1 to 12) has in the given year of "
       "the Gregorian calendar",
       "if month == 2:\n        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28\n"
       "    return 30 if month in (4, 6, 9, 11) else 31",
       (2, 2024), (2, 2023), (4, 2023), (1, 1999), (2, 1900)),
    _t("common_elements(a, b)", "returns the elements of the list a that are also in the list b, in a's "
       "order and without repeats",
       "result = []\n    for x in a:\n        if x in b and x not in result:\n            result.append(x)\n"
       "    return result",
       ([1, 2, 3, 4], [2, 4, 6]), ([1, 1, 2], [1]), ([], [1])),
    _t("is_subset(a, b)", "returns True if every element of the list a is also in the list b",
       "return all(x in b for x in a)", ([1, 2], [1, 2, 3]), ([1, 4], [1, 2, 3]), ([], []), (["a"], [])),
    _t("grade_letter(score)", "returns 'A' for a score of 90 or more, 'B' for 80 or more, 'C' for 70 or "
       "more, 'D' for 60 or more and 'F' otherwise",
       "for cutoff, letter in ((90, 'A'), (80, 'B'), (70, 'C'), (60, 'D')):\n        if score >= cutoff:\n"
       "            return letter\n    return 'F'",
       (95,), (80,), (65,), (12,), (70,)),
    _t("parse_key_values(s)", "parses a string like 'a=1;b=2' into a dictionary of strings such as "
       "{'a': '1', 'b': '2'} (an empty string gives an empty dictionary)",
       "result = {}\n    for part in s.split(';'):\n        if part:\n"
       "            key, value = part.split('=', 1)\n            result[key] = value\n    return result",
       ("a=1;b=2",), ("",), ("name=Ada",)),
    _t("missing_numbers(numbers, n)", "returns, in increasing order, the numbers from 1 to n that are not "
       "in the list", "return [k for k in range(1, n + 1) if k not in numbers]",
       ([1, 3], 4), ([], 2), ([1, 2, 3], 3)),
    _t("index_words(words)", "returns a dictionary mapping each word of the list to the position where "
       "it first appears",
       "index = {}\n    for i, word in enumerate(words):\n        index.setdefault(word, i)\n"
       "    return index",
       (["a", "b", "a"],), ([],), (["x"],)),
    _t("nested_get(d, keys)", "follows the list of keys through nested dictionaries starting at d and "
       "returns the value reached, or None if a key is missing on the way",
       "for key in keys:\n        if not isinstance(d, dict) or key not in d:\n            return None\n"
       "        d = d[key]\n    return d",
       ({"a": {"b": 1}}, ["a", "b"]), ({"a": {}}, ["a", "b"]), ({"x": 2}, []), ({"a": 5}, ["a", "b"])),
    _t("lookup_all(d, keys)", "returns the list of d's values for those of the keys that d has, in the "
       "order of keys", "return [d[k] for k in keys if k in d]",
       ({"a": 1, "b": 2}, ["b", "c", "a"]), ({}, ["x"]), ({"a": 1}, [])),
    _t("is_strong_password(s)", "returns True if s has at least 8 characters, at least one digit and at "
       "least one upper-case letter",
       "return len(s) >= 8 and any(ch.isdigit() for ch in s) and any(ch.isupper() for ch in s)",
       ("Secret123",), ("secret123",), ("Ab1",), ("ABCDEFGH9",)),
    _t("dict_from_pairs(pairs)", "returns a dictionary built from a list of (key, value) pairs; a later "
       "pair with the same key wins", "return dict(pairs)",
       ([("a", 1), ("b", 2)],), ([],), ([("x", 1), ("x", 2)],)),
    _t("evaluate_rpn(tokens)", "evaluates an expression in reverse Polish notation given as a list of "
       "string tokens (integers and the operators '+', '-' and '*') and returns the integer result",
       "stack = []\n    for token in tokens:\n        if token in ('+', '-', '*'):\n"
       "            b, a = stack.pop(), stack.pop()\n"
       "            stack.append(a + b if token == '+' else a - b if token == '-' else a * b)\n"
       "        else:\n            stack.append(int(token))\n    return stack[0]",
       (["2", "3", "+"],), (["5", "1", "2", "+", "*"],), (["7"],), (["4", "10", "-"],)),
    _t("count_true(flags)", "returns how many values in the list are True",
       "return sum(1 for f in flags if f)",
       ([True, False, True],), ([],), ([False],)),
]


def _in_turn(*kinds: list[Task]) -> list[Task]:
    """One task of each kind in turn, so any prefix mixes the kinds."""
    mixed = []
    for round_ in range(max(len(kind) for kind in kinds)):
        mixed.extend(kind[round_] for kind in kinds if round_ < len(kind))
    return mixed


# The first 60 keep their place (same ids, and every `limit` up to 60 keeps its items); the rest
# come after, kinds in turn.
TASKS: list[Task] = FIRST_TASKS + _in_turn(NUMBER_TASKS, TEXT_TASKS, LIST_TASKS, MAPPING_TASKS)


def _call(entry_point: str, args: tuple[Any, ...]) -> str:
    return f"{entry_point}({', '.join(repr(a) for a in args)})"


def canonical_source(task: Task) -> str:
    return f"def {task.signature}:\n    {task.solution}\n"


def build(task: Task, index: int) -> dict[str, str]:
    """One data row: the prompt, the canonical solution and asserts computed from it."""
    scope: dict[str, Any] = {}
    exec(canonical_source(task), scope)  # our own reference code, not model output
    function = scope[task.entry_point]
    example = _call(task.entry_point, task.cases[0])
    prompt = (
        f"Write a Python function `{task.signature}` that {task.does}. "
        f"For example, `{example}` returns `{function(*task.cases[0])!r}`."
    )
    tests = "".join(
        f"assert {_call(task.entry_point, args)} == {function(*args)!r}\n" for args in task.cases
    )
    return {
        "id": f"code-{index:04d}",
        "entry_point": task.entry_point,
        "prompt": prompt,
        "tests": tests,
        "canonical_solution": canonical_source(task),
    }


def generate() -> list[dict[str, str]]:
    return [build(task, index) for index, task in enumerate(TASKS)]


def write(path: Path = DATA_PATH) -> Path:
    return write_jsonl(path, generate())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DATA_PATH)
    args = parser.parse_args(argv)
    path = write(args.out)
    print(f"wrote {len(TASKS)} tasks to {path}")


if __name__ == "__main__":
    main()
