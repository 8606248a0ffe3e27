#pragma once
// A skip that CTest and CI can see. doctest has no "skipped" state for a test case that finds at
// run time that it cannot run here (no GPU, not root), so:
//   - such a test case belongs to a suite named for what it needs: TEST_CASE("..." * TP_NEEDS("cuda"));
//   - it skips with TP_SKIP(reason), which prints one "SKIPPED:" line and returns;
//   - tests/CMakeLists.txt registers each needs_X suite of an executable as a CTest test of its own
//     (`torch.needs_cuda`, ...) with SKIP_RETURN_CODE 77, and the shards leave those suites out;
//   - the runner (doctest_main.cpp) exits 77 when every case it ran skipped, so CTest reports the
//     test as skipped, never as passed; it also prints how many cases skipped and why.
// TP_SKIP in a case outside a needs_ suite fails that case: a skip must never hide in a shard
// whose other cases pass. .ci/suite.sh fails CI on any skip but the CUDA ones.
#include <doctest/doctest.h>

#include <sstream>
#include <string>

namespace tptest {
// Defined in doctest_main.cpp: records the skip of the running case; false when the case is not in
// a needs_ suite (the caller then fails it).
bool note_skip(const std::string& reason);
}  // namespace tptest

#define TP_NEEDS(what) doctest::test_suite("needs_" what)

#define TP_SKIP(reason)                                                                                       \
  do {                                                                                                        \
    std::ostringstream tp_skip_reason_;                                                                       \
    tp_skip_reason_ << reason;                                                                                \
    if (!tptest::note_skip(tp_skip_reason_.str())) {                                                          \
      FAIL("TP_SKIP in a test case outside a needs_ suite (add * TP_NEEDS(...)): " << tp_skip_reason_.str()); \
    }                                                                                                         \
    MESSAGE("SKIPPED: " << tp_skip_reason_.str());                                                            \
    return;                                                                                                   \
  } while (false)
