import unittest

from tinystats import mean, spread


class MeanTest(unittest.TestCase):
    def test_two_values(self):
        self.assertEqual(mean([2, 4]), 3.0)

    def test_one_value(self):
        self.assertEqual(mean([5]), 5.0)

    def test_empty_list_is_refused(self):
        with self.assertRaises(ValueError):
            mean([])


def test_spread():
    assert spread([3, 9, 4]) == 6
