// The single-header edition works on its own: this TU sees single_include/ and the dependencies'
// include directories, never include/torchprobe/, and runs a real capture through it. Built with
// the single header's compiled library (torchprobe_compiled.cpp, TORCHPROBE_COMPILED_LIB): the
// DirectorySink Debugger below is the library's; this file has the implementations too
// (TORCHPROBE_INCLUDE_IMPLEMENTATION) for its MemorySink one.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include "torchprobe.hpp"

#include "../remove_tree.hpp"

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>

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

#if !defined(TORCHPROBE_COMPILED_LIB) || !defined(TORCHPROBE_INCLUDE_IMPLEMENTATION)
#error "this test is built with the single header's compiled library (tests/packaging/CMakeLists.txt)"
#endif

TEST_CASE("single header with its compiled library: a mix statistics dump of a Linear written to disk") {
  // The library's Debugger<Mix, Statistics> (DirectorySink): this file only declares it.
  const std::string path = "/tmp/torchprobe-single-include-lib-" + std::to_string(::getpid());
  torch::nn::Linear fc(2, 1);
  {
    torch::NoGradGuard no_grad;
    fc->weight.fill_(2.0);
    fc->bias.fill_(0.5);
  }
  {
    tp::Debugger<tp::Level::Mix, tp::Task::Statistics> dbg(tp::Options().dump_path(path));
    const torch::Tensor x = torch::tensor({{1.0f, 3.0f}});
    {
      tp::ScopedDump scope(dbg, fc);
      fc(x).sum().backward();
    }
    dbg.wait_written();
    std::ifstream in(dbg.directory() + "/dump.json");
    REQUIRE(in.good());
    std::stringstream text;
    text << in.rdbuf();
    const auto dump = nlohmann::json::parse(text.str());
    // 2*1 + 2*3 + 0.5 = 8.5, the Linear's one output value (a model that is a lone Linear is the
    // root: its call is the addmm entry, it has no module entry of its own).
    const auto& out = dump.at("data").at("Aten.addmm.0.forward").at("output")[0];
    CHECK(out.at("Max").get<double>() == 8.5);
    CHECK(out.at("Min").get<double>() == 8.5);
    CHECK(dump.at("data").contains("Aten.addmm.0.backward"));
    CHECK(dump.at("level") == "mix");
  }
  tptest::remove_tree(path);
}
