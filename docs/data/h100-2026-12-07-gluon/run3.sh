#!/bin/bash
# session 55, GPU call 3 (about 110 s; the last of the budget after refused starts), any card: the D=64 middle band's
# full-call entry against the reference (run1.sh's first part: test_two_ctas_per_sm_against_the_reference, whose
# full-m64n64b2r24/104seq case is the entry, and SHAPES.md's D=64 rows through the drop-in).
exec bash "$(dirname "$0")/run1.sh" tests
