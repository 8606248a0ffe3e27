// The skip mechanism's own cases (tests/skip.hpp), run only by CTest's skip_reporting
// (tests/skip_reporting.cmake): neither is part of the plain `unit` run, the first being in a needs_
// suite and the second marked doctest::skip.
#include <doctest/doctest.h>

#include "../skip.hpp"

// Not TP_NEEDS: that would register it as a CTest test of its own (unit.needs_skip_selfcheck) that
// always skips; skip_reporting runs it and checks what the runner says.
TEST_CASE("a case that cannot run here skips, and the runner counts it" * doctest::test_suite("needs_skip_selfcheck")) {
  TP_SKIP("the skip mechanism's own check");
}

TEST_CASE("TP_SKIP outside a needs_ suite fails its case" * doctest::test_suite("skip_selfcheck_outside") *
          doctest::skip()) {
  TP_SKIP("this skip must fail the case");
}
