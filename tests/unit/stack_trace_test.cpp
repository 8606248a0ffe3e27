// Call-stack capture and symbolization for stack.json.
// The executable must be linked with -rdynamic so that dladdr can name its functions.
#include <doctest/doctest.h>

#include <algorithm>
#include <regex>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include <dlfcn.h>

#include "torchprobe/io/call_stack_capture.hpp"
#include "torchprobe/io/stack_json.hpp"
#include "torchprobe/io/symbolizer.hpp"
#include "../skip.hpp"

using torchprobe::CallStack;
using torchprobe::io::capture_call_stack;
using torchprobe::io::symbolize;

// External linkage and noinline: the functions get their own frames and dynamic symbols.
namespace tp_stack_test {

__attribute__((noinline)) CallStack capture_here() {
  CallStack s = capture_call_stack();  // TP_CAPTURE_SITE
  asm volatile("");                    // keeps the call from becoming a tail call
  return s;
}

__attribute__((noinline)) CallStack capture_elsewhere() {
  CallStack s = capture_call_stack();
  asm volatile("");
  return s;
}

// Called with a depth read from a volatile, so the compiler cannot make per-depth clones
// ("outer(int) [clone .constprop.1]"), which are local symbols that dladdr cannot name.
volatile int depth_two = 2;

__attribute__((noinline)) std::pair<CallStack, CallStack> capture_with_both_unwinders() {
  CallStack fastest = capture_call_stack(48, torchprobe::io::Unwinder::Fastest);
  CallStack glibc = capture_call_stack(48, torchprobe::io::Unwinder::Glibc);
  asm volatile("");
  return {fastest, glibc};
}

__attribute__((noinline)) CallStack outer(int depth) {
  CallStack s = depth > 0 ? outer(depth - 1) : capture_here();
  asm volatile("");
  return s;
}

}  // namespace tp_stack_test

namespace {

std::string func_of(const std::string& frame) {  // "File p, line n, in FUNC, \n text"
  const auto a = frame.find(", in ");
  const auto b = frame.find(", \n ");
  return frame.substr(a + 5, b - a - 5);
}

}  // namespace

TEST_CASE("CallStack equality and hash") {
  std::vector<CallStack> same;  // one call site (the loop body) gives the same return addresses
  volatile int n = 2;           // volatile: the loop must not be unrolled into two call sites
  for (int i = 0; i < n; ++i) same.push_back(tp_stack_test::capture_here());
  const CallStack& a = same[0];
  const CallStack& b = same[1];
  const CallStack c = tp_stack_test::capture_elsewhere();
  CHECK(a == b);
  CHECK(a != c);
  CHECK(torchprobe::CallStackHash{}(a) == std::hash<CallStack>{}(b));
  std::unordered_set<CallStack> set = {a, b, c};
  CHECK(set.size() == 2);
  CHECK(capture_call_stack(0).frames.empty());
  CHECK(capture_call_stack(2).frames.size() == 2);
  CHECK(!a.frames.empty());
}

// The costs of capture and symbolize: benchmarks/stack_benchmark.cpp.
TEST_CASE("libunwind, where it loads, finds the same return addresses as glibc's backtrace()" * TP_NEEDS("libunwind")) {
  // Without libunwind.so.8 Unwinder::Fastest is glibc too: comparing it with itself proves nothing.
  if (!torchprobe::io::libunwind_available()) TP_SKIP("libunwind.so.8 does not load here (install libunwind8)");
  auto [fastest, glibc] = tp_stack_test::capture_with_both_unwinders();
  // Under AddressSanitizer backtrace() is the runtime's interceptor, whose frame comes first.
  auto& g = glibc.frames;
  g.erase(std::remove_if(g.begin(), g.end(),
                         [](void* pc) {
                           Dl_info info{};
                           const std::string object =
                               dladdr(pc, &info) != 0 && info.dli_fname != nullptr ? info.dli_fname : "";
                           return object.find("/libasan.so") != std::string::npos ||
                                  object.find("/libubsan.so") != std::string::npos;
                         }),
          g.end());
  REQUIRE(glibc.frames.size() >= 3);
  REQUIRE(fastest.frames.size() == glibc.frames.size());
  auto function_of = [](void* pc) {
    Dl_info info{};
    return dladdr(pc, &info) != 0 ? info.dli_saddr : nullptr;
  };
  // Up to the test function, each capture has its own call sites (capture_call_stack may or may
  // not be inlined), in the same functions; from the test function's caller on, the frames are equal.
  const void* test_function = reinterpret_cast<void*>(&tp_stack_test::capture_with_both_unwinders);
  std::size_t k = 0;
  while (k < glibc.frames.size() && function_of(glibc.frames[k]) != test_function) ++k;
  REQUIRE(k + 1 < glibc.frames.size());
  for (std::size_t i = 0; i <= k; ++i) {
    CAPTURE(i);
    CHECK(function_of(fastest.frames[i]) == function_of(glibc.frames[i]));
  }
  for (std::size_t i = k + 1; i < glibc.frames.size(); ++i) {
    CAPTURE(i);
    CHECK(fastest.frames[i] == glibc.frames[i]);
  }
}

TEST_CASE("symbolize names the caller and drops runtime frames") {
  auto& sym = torchprobe::io::details::Symbolizer::instance();
  for (bool addr2line : {false, true}) {
    CAPTURE(addr2line);
    sym.set_use_addr2line(addr2line);
    sym.clear_cache();
    const std::vector<std::string> frames = symbolize(tp_stack_test::outer(tp_stack_test::depth_two));
    std::string all;  // printed only when a check fails
    for (const auto& f : frames) all += f + "\n";
    INFO(all);
    REQUIRE(frames.size() >= 4);
    // Innermost first: capture_here, then the three outer() frames.
    CHECK(func_of(frames[0]) == "tp_stack_test::capture_here()");
    CHECK(func_of(frames[1]) == "tp_stack_test::outer(int)");
    CHECK(func_of(frames[3]) == "tp_stack_test::outer(int)");
    const std::regex shape(R"(File [^\n]+, line \d+, in [^\n]+, \n [^\n]+)");
    for (const auto& f : frames) {
      CAPTURE(f);
      CHECK(std::regex_match(f, shape));
      CHECK(f.find("torchprobe::") == std::string::npos);
      CHECK(f.find("libc.so") == std::string::npos);
      CHECK(f.find("__libc_start") == std::string::npos);
      CHECK(func_of(f) != "_start");
    }
    // Without debug info (or addr2line) the frame is object file, line 0, object+offset.
    if (frames[0].find(", line 0, ") != std::string::npos) {
      CHECK(frames[0].find("File /") == 0);
      CHECK(std::regex_search(frames[0], std::regex(R"(\n [^/\s]+\+0x[0-9a-f]+$)")));
    } else {  // built with -g and addr2line present: this file, and the capture line's text
      CHECK(addr2line);
      CHECK(frames[0].find("stack_trace_test.cpp, line ") != std::string::npos);
      CHECK(frames[0].find("TP_CAPTURE_SITE") != std::string::npos);
    }
  }
  sym.set_use_addr2line(true);
}

TEST_CASE("nothing left gives msprobe's failure text") {
  const std::vector<std::string> failed = {"The call stack retrieval failed."};
  CHECK(symbolize(CallStack{}) == failed);
  void* libc_fn = ::dlsym(RTLD_DEFAULT, "getpid");  // an address inside libc.so
  REQUIRE(libc_fn != nullptr);
  CHECK(symbolize(CallStack{{static_cast<char*>(libc_fn) + 1}}) == failed);
}

TEST_CASE("internal function filter") {
  using torchprobe::io::details::is_internal_function;
  CHECK(is_internal_function("torchprobe::io::capture_call_stack(int)"));
  CHECK(is_internal_function("void torchprobe::details::f<int>(int)"));
  CHECK(is_internal_function("c10::impl::BoxedKernelWrapper<at::Tensor (at::Tensor const&)>::call()"));
  CHECK(is_internal_function("at::_ops::add_Tensor::call(at::Tensor const&, at::Tensor const&, c10::Scalar const&)"));
  CHECK(is_internal_function("at::RecordFunction::before(char const*, long)"));
  CHECK(is_internal_function(
      "std::_Function_handler<void (), torchprobe::Hooks::install()::{lambda()#1}>::_M_invoke(std::_Any_data const&)"));
  CHECK(is_internal_function("__libc_start_call_main"));
  CHECK(is_internal_function("_start"));
  CHECK_FALSE(is_internal_function("main"));
  CHECK_FALSE(is_internal_function("Net::forward(at::Tensor)"));
  CHECK_FALSE(is_internal_function("user_fn(torchprobe::Config const&)"));
  CHECK_FALSE(is_internal_function("at::add(at::Tensor const&, at::Tensor const&, c10::Scalar const&)"));
  CHECK_FALSE(is_internal_function("(anonymous namespace)::helper()"));
  CHECK_FALSE(is_internal_function("std::vector<int, std::allocator<int> >::push_back(int const&)"));
}

TEST_CASE("build_stack_json groups identical stacks in first-appearance order") {
  std::vector<std::pair<std::string, CallStack>> entries;
  // Same call site for add.0, add.1 and add.3; mul.0 comes from another one in between.
  volatile int n = 4;  // volatile: the loop must not be unrolled into separate call sites
  for (int i = 0, add = 0; i < n; ++i) {
    if (i == 2)
      entries.emplace_back("Aten.mul.0.forward", tp_stack_test::capture_elsewhere());
    else
      entries.emplace_back("Aten.add." + std::to_string(add++) + ".forward", tp_stack_test::capture_here());
  }
  // Different raw stacks that symbolize alike (nothing of the user's) share a group, as in msprobe.
  void* libc_fn = ::dlsym(RTLD_DEFAULT, "getpid");
  entries.emplace_back("Aten.empty.0.forward", CallStack{});
  entries.emplace_back("Aten.empty.1.forward", CallStack{{static_cast<char*>(libc_fn) + 1}});

  const nlohmann::ordered_json j = torchprobe::io::build_stack_json(entries);
  REQUIRE(j.size() == 3);
  auto it = j.begin();
  CHECK(it.key() == "0");
  CHECK(it.value()[0] == nlohmann::ordered_json({"Aten.add.0.forward", "Aten.add.1.forward", "Aten.add.2.forward"}));
  CHECK(it.value()[1] == nlohmann::ordered_json(symbolize(entries[0].second)));
  ++it;
  CHECK(it.key() == "1");
  CHECK(it.value()[0] == nlohmann::ordered_json({"Aten.mul.0.forward"}));
  CHECK(func_of(it.value()[1][0].get<std::string>()) == "tp_stack_test::capture_elsewhere()");
  ++it;
  CHECK(it.key() == "2");
  CHECK(it.value() ==
        nlohmann::ordered_json::parse(
            R"([["Aten.empty.0.forward", "Aten.empty.1.forward"], ["The call stack retrieval failed."]])"));
  CHECK(torchprobe::io::build_stack_json({}) == nlohmann::ordered_json::object());
}

TEST_CASE("capture and symbolize from several threads") {
  std::vector<std::thread> threads;
  std::vector<std::vector<std::string>> results(8);
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([t, &results] {
      for (int i = 0; i < 50; ++i) results[static_cast<std::size_t>(t)] = symbolize(tp_stack_test::outer(t % 3));
    });
  for (auto& th : threads) th.join();
  for (const auto& r : results) CHECK(func_of(r.at(0)) == "tp_stack_test::capture_here()");
}
