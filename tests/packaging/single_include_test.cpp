// The single-header edition works on its own: this TU sees single_include/ and the dependencies'
// include directories, never include/torchprobe/, and runs a real capture through it.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include "torchprobe.hpp"

#include <cmath>
#include <string>

// If include/ leaked onto the include path, this test would prove nothing about the single header.
#if __has_include(<torchprobe/debugger.hpp>)
#error "include/torchprobe is visible to the single-header test: its include path must be single_include/ only"
#endif

namespace tp = torchprobe;

TEST_CASE("single header: version macros agree with the CMake project version") {
  const std::string macros = std::to_string(TORCHPROBE_VERSION_MAJOR) + "." + std::to_string(TORCHPROBE_VERSION_MINOR) +
                             "." + std::to_string(TORCHPROBE_VERSION_PATCH);
  CHECK(macros == TORCHPROBE_VERSION_STRING);
  CHECK(macros == TORCHPROBE_EXPECTED_VERSION);
}

TEST_CASE("single header: an L1 statistics capture into a MemorySink records relu with its statistics") {
  tp::Debugger<tp::Level::L1, tp::Task::Statistics, tp::MemorySink> dbg(
      tp::Options().dump_path("/tmp/torchprobe-single-include").extra_info(false));
  const auto x = torch::tensor({-2.0f, -0.5f, 1.0f, 3.0f});
  {
    tp::ScopedDump scope(dbg);
    torch::relu(x);
  }
  const auto& data = dbg.sink().step(0).dump.at("data");
  REQUIRE(data.contains("Aten.relu.0.forward"));
  const auto& out = data["Aten.relu.0.forward"]["output"][0];
  CHECK(out["Max"].get<double>() == 3.0);
  CHECK(out["Min"].get<double>() == 0.0);
  CHECK(out["Mean"].get<double>() == doctest::Approx(1.0));
  CHECK(out["Norm"].get<double>() == doctest::Approx(std::sqrt(10.0)));
}
