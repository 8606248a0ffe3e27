// The one translation unit that holds doctest's runner; every test executable links it.
//
// Beside doctest's own summary it counts the cases that skipped at run time (tests/skip.hpp): it
// prints them with their reasons, and exits 77 (CTest's SKIP_RETURN_CODE) when every case it ran
// skipped, so that a run that checked nothing is reported as skipped rather than passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "skip.hpp"

namespace {

struct SkipLedger {
  std::mutex lock;
  std::string suite;  // of the running case
  std::string name;
  int cases_run = 0;
  std::vector<std::string> skipped;  // "needs_X: case: reason"
};

SkipLedger& ledger() {
  static SkipLedger l;
  return l;
}

// A listener, not a reporter: doctest's console output stays as it is.
struct SkipListener : doctest::IReporter {
  explicit SkipListener(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData& tc) override {
    std::lock_guard<std::mutex> g(ledger().lock);
    ledger().suite = tc.m_test_suite ? tc.m_test_suite : "";
    ledger().name = tc.m_name ? tc.m_name : "";
    ++ledger().cases_run;
  }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

REGISTER_LISTENER("torchprobe_skips", 1, SkipListener);

}  // namespace

bool tptest::note_skip(const std::string& reason) {
  std::lock_guard<std::mutex> g(ledger().lock);
  if (ledger().suite.rfind("needs_", 0) != 0) return false;
  const std::string entry = ledger().suite + ": " + ledger().name + ": " + reason;
  // A case re-entered for its subcases may skip once per pass: count the case once.
  for (const std::string& s : ledger().skipped) {
    if (s == entry) return true;
  }
  ledger().skipped.push_back(entry);
  return true;
}

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int result = context.run();
  if (context.shouldExit()) return result;
  SkipLedger& l = ledger();
  if (!l.skipped.empty()) {
    std::printf("[torchprobe] %zu of %d test cases skipped at run time:\n", l.skipped.size(), l.cases_run);
    for (const std::string& s : l.skipped) std::printf("[torchprobe]   %s\n", s.c_str());
  }
  if (result == 0 && l.cases_run > 0 && static_cast<int>(l.skipped.size()) == l.cases_run) return 77;
  return result;
}
