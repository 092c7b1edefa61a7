"""Tests of code_order.py (python3 -m unittest discover -s scripts/lib)."""

import contextlib
import io
import os
import tempfile
import unittest
from unittest import mock

import code_order

H1 = "17h0123456789abcdefE"
H2 = "17hfedcba9876543210E"

# A callgrind output as valgrind writes it with --demangle=no
# --dump-instr=no: names given once with an id, then the id alone; a call's
# inclusive cost on the line after its `calls=`; a recursive call's name
# with a `'2`; functions of other objects (libc) beside the program's.
CALLGRIND = f"""\
# callgrind format
version: 1
creator: callgrind-3.19.0
positions: line
events: Ir
summary: 1000

ob=(1) /usr/lib/x86_64-linux-gnu/libc.so.6
fl=(1) ???
fn=(1) memcpy
0 50

ob=(2) /opt/gputel/gputel-collector
fl=(2) ???
fn=(2) _ZN3hot4loop{H1}
0 400
+3 100
cob=(1)
cfi=(1)
cfn=(1)
calls=10 0
0 9999
cfn=(3) _ZN4cold5start{H1}
calls=1 0
0 7777
fn=(3)
0 20
fn=(4) _ZN4tree4walk{H1}'2
* 60
fn=(4)
0 5
fn=(5) _ZN4warm4tick{H1}
0 250
"""


class ProfileTest(unittest.TestCase):
    def test_own_costs_of_the_programs_functions(self):
        with tempfile.NamedTemporaryFile("w", suffix=".out", delete=False) as f:
            f.write(CALLGRIND)
        self.addCleanup(os.unlink, f.name)
        costs = code_order.callgrind_costs(f.name, "/gputel-collector")
        self.assertEqual(
            costs,
            {
                f"_ZN3hot4loop{H1}": 500,  # 400 + 100, not the calls' 9999 + 7777
                f"_ZN4cold5start{H1}": 20,
                f"_ZN4tree4walk{H1}": 65,  # the recursion's name folded into its own
                f"_ZN4warm4tick{H1}": 250,
            },
        )

    def test_the_list_is_hottest_first_and_only_the_programs(self):
        with tempfile.TemporaryDirectory() as d:
            profile = os.path.join(d, "callgrind.1.out")
            with open(profile, "w") as f:
                f.write(CALLGRIND)
            symbols = {
                f"_ZN3hot4loop{H1}": 10,
                f"_ZN4cold5start{H1}": 20,
                f"_ZN4tree4walk{H1}": 30,
                f"_ZN4warm4tick{H1}": 40,
                f"_ZN5never3run{H1}": 50,
            }
            out = os.path.join(d, "order.txt")
            said = io.StringIO()
            with (
                mock.patch.object(code_order, "code_symbols", return_value=symbols),
                contextlib.redirect_stderr(said),
            ):
                code_order.profile("/opt/gputel/gputel-collector", out, [profile])
            self.assertIn("4 functions ran, 0.00 MB of the 0.00 MB", said.getvalue())
            with open(out) as f:
                written = f.read()
            header = code_order.header("gputel-collector")
            self.assertIn("# The functions gputel-collector runs at work", header)
            self.assertTrue(written.startswith(header))
            self.assertEqual(
                written[len(header) :].split(),
                [
                    f"_ZN3hot4loop{H1}",
                    f"_ZN4warm4tick{H1}",
                    f"_ZN4tree4walk{H1}",
                    f"_ZN4cold5start{H1}",
                ],
            )


class ResolveTest(unittest.TestCase):
    def test_names_are_taken_as_they_are_else_by_a_unique_name_without_hash(self):
        symbols = {
            f"_ZN3hot4loop{H2}": 100,  # the listed one, rehashed
            f"_ZN4warm4tick{H1}": 200,  # as listed
            f"_ZN5alloc3vec4push{H1}": 300,  # a generic function twice
            f"_ZN5alloc3vec4push{H2}": 400,
            "ZSTD_compressBlock": 500,  # C: no hash
        }
        listed = [
            "# a comment",
            f"_ZN4warm4tick{H1}",
            f"_ZN3hot4loop{H1}",
            "_ZN5alloc3vec4push17h1111111111111111E",
            f"_ZN4gone4away{H1}",
            "ZSTD_compressBlock",
        ]
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "order.txt")
            out = os.path.join(d, "collector.order")
            with open(src, "w") as f:
                f.write("\n".join(listed) + "\n")
            said = io.StringIO()
            with (
                mock.patch.object(code_order, "code_symbols", return_value=symbols),
                contextlib.redirect_stderr(said),
            ):
                code_order.resolve("gputel-collector", src, out)
            self.assertIn(
                "gputel-collector has 2 by their name and 1 by their name without its hash; "
                "2 are not found",
                said.getvalue(),
            )
            with open(out) as f:
                self.assertEqual(
                    f.read().split(),
                    [f"_ZN4warm4tick{H1}", f"_ZN3hot4loop{H2}", "ZSTD_compressBlock"],
                )

    def test_the_hash_of_legacy_mangling_is_what_key_drops(self):
        self.assertEqual(code_order.key(f"_ZN3hot4loop{H1}"), "_ZN3hot4loopE")
        self.assertEqual(code_order.key("ZSTD_compressBlock"), "ZSTD_compressBlock")


if __name__ == "__main__":
    unittest.main()
