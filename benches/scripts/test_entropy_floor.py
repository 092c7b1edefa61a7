"""entropy-floor.py's binned estimate on values of known entropy."""

import importlib.util
import math
import random
import unittest
from collections import Counter
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "entropy_floor", Path(__file__).with_name("entropy-floor.py"))
entropy_floor = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(entropy_floor)


class BinnedEstimate(unittest.TestCase):
    def test_small_values_are_counted_each_for_itself(self):
        values = {0: 50, 3: 25, -7: 25}
        self.assertAlmostEqual(entropy_floor.binned_estimate_bits(values), 150.0)
        self.assertAlmostEqual(entropy_floor.binned_estimate_bits(values),
                               entropy_floor.plug_in_bits([50, 25, 25]))

    def test_spread_values_come_out_near_their_entropy_not_at_the_cap(self):
        # 20 000 readings of a normal spread of 3.45e8 4-byte words, counted
        # in bytes (multiples of 4), centred far above zero: about
        # log2(sigma * sqrt(2 pi e)) = 30.4 bits each, where the plug-in
        # estimate, every value distinct, stops at log2(20 000) = 14.3.
        rng = random.Random(7)
        sigma = 3.45e8
        n = 20_000
        values = Counter(4 * round(rng.gauss(1.15e10, sigma)) for _ in range(n))
        truth = math.log2(sigma * math.sqrt(2 * math.pi * math.e))
        plug_in = entropy_floor.plug_in_bits(list(values.values())) / n
        binned = entropy_floor.binned_estimate_bits(values) / n
        self.assertLess(plug_in, 14.4)
        self.assertAlmostEqual(binned, truth, delta=0.15)

    def test_zeros_beside_spread_values_cost_what_their_share_says(self):
        # Half zeros, half uniform over 2^30 multiples of 4 (2^28 values):
        # 1 bit for which half, then 28 bits for the uniform half.
        rng = random.Random(11)
        n = 40_000
        values = Counter([0] * (n // 2))
        values.update(4 * rng.randrange(1 << 28) for _ in range(n // 2))
        binned = entropy_floor.binned_estimate_bits(values) / n
        self.assertAlmostEqual(binned, 1 + 28 / 2, delta=0.1)

    def test_too_few_wide_values_are_counted_each_for_itself(self):
        values = {1 << 20: 1, 3 << 20: 1, 0: 10}
        self.assertAlmostEqual(entropy_floor.binned_estimate_bits(values),
                               entropy_floor.plug_in_bits([1, 1, 10]))


if __name__ == "__main__":
    unittest.main()
