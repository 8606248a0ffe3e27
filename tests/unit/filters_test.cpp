// NameFilter: scope ranges, list substrings and risk levels, applied in execution order.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "torchprobe/config/config.hpp"
#include "torchprobe/config/name_filter.hpp"

using namespace torchprobe;

namespace {

Config config_with(Level level, std::vector<std::string> scope, std::vector<std::string> list,
                   RiskLevel risk = RiskLevel::All, Task task = Task::Statistics) {
  Config c;
  c.level = level;
  c.task = task;
  c.scope = std::move(scope);
  c.list = std::move(list);
  c.risk_level = risk;
  return c;
}

// The names of `run` the filter admits, in order.
std::vector<std::string> admitted(NameFilter& filter, const std::vector<std::string>& run) {
  std::vector<std::string> out;
  for (const std::string& name : run)
    if (filter.admit(name)) out.push_back(name);
  return out;
}

const std::vector<std::string> kRun = {"Aten.addmm.0.forward", "Aten.t.0.forward",     "Aten.relu.0.forward",
                                       "Aten.sum.0.forward",   "Aten.sum.0.backward",  "Aten.relu.0.backward",
                                       "Aten.t.0.backward",    "Aten.addmm.0.backward"};

}  // namespace

TEST_CASE("without scope or list every name is admitted") {
  NameFilter f(config_with(Level::L1, {}, {}));
  CHECK(admitted(f, kRun) == kRun);
}

TEST_CASE("a scope admits its start, everything in between and its end, and nothing after") {
  NameFilter f(config_with(Level::L1, {"Aten.t.0.forward", "Aten.sum.0.forward"}, {}));
  CHECK(admitted(f, kRun) == std::vector<std::string>{"Aten.t.0.forward", "Aten.relu.0.forward", "Aten.sum.0.forward"});
}

TEST_CASE("a scope whose start and end are the same name admits just that name") {
  NameFilter f(config_with(Level::L1, {"Aten.relu.0.forward", "Aten.relu.0.forward"}, {}));
  CHECK(admitted(f, kRun) == std::vector<std::string>{"Aten.relu.0.forward"});
}

TEST_CASE("a scope over backward names follows backward execution order") {
  NameFilter f(config_with(Level::L1, {"Aten.relu.0.backward", "Aten.addmm.0.backward"}, {}));
  CHECK(admitted(f, kRun) ==
        std::vector<std::string>{"Aten.relu.0.backward", "Aten.t.0.backward", "Aten.addmm.0.backward"});
}

TEST_CASE("a list admits names containing any of its strings") {
  NameFilter f(config_with(Level::L1, {}, {"relu", "addmm.0.forward"}));
  CHECK(admitted(f, kRun) ==
        std::vector<std::string>{"Aten.addmm.0.forward", "Aten.relu.0.forward", "Aten.relu.0.backward"});
}

TEST_CASE("list matching is a case-sensitive substring test, as in msprobe") {
  NameFilter f(config_with(Level::Mix, {}, {"relu"}));
  CHECK(f.admit("Aten.relu_.2.backward"));
  CHECK(f.admit("Module.relu.ReLU.forward.0"));
  CHECK_FALSE(f.admit("Module.act.ReLU.forward.0"));
}

TEST_CASE("with scope and list, the list filters inside the range") {
  NameFilter f(config_with(Level::L1, {"Aten.addmm.0.forward", "Aten.relu.0.backward"}, {"relu", "sum"}));
  CHECK(admitted(f, kRun) == std::vector<std::string>{"Aten.relu.0.forward", "Aten.sum.0.forward",
                                                      "Aten.sum.0.backward", "Aten.relu.0.backward"});
}

TEST_CASE("the range closes after its end even when the list rejects the end name") {
  NameFilter f(config_with(Level::L1, {"Aten.t.0.forward", "Aten.relu.0.forward"}, {"sum"}));
  CHECK(admitted(f, kRun).empty());
}

TEST_CASE("reset turns an open range off, so the next step waits for the start again") {
  NameFilter f(config_with(Level::L1, {"Aten.t.0.forward", "Aten.sum.0.backward"}, {}));
  CHECK(f.admit("Aten.t.0.forward"));
  CHECK(f.admit("Aten.relu.0.forward"));
  f.reset();
  CHECK_FALSE(f.admit("Aten.relu.0.forward"));
  CHECK(f.admit("Aten.t.0.forward"));
  CHECK(f.admit("Aten.sum.0.backward"));
  CHECK_FALSE(f.admit("Aten.addmm.0.backward"));
}

TEST_CASE("an L0 module range reported through enter and exit covers everything inside the end module") {
  NameFilter f(config_with(Level::L0, {"Module.a.Linear.forward.0", "Module.b.Seq.forward.0"}, {}));
  CHECK_FALSE(f.admit("Module.z.Linear.forward.0"));
  f.enter_module("Module.a.Linear.forward.0");
  CHECK(f.admit("Module.a.Linear.forward.0"));
  f.exit_module("Module.a.Linear.forward.0");
  f.enter_module("Module.b.Seq.forward.0");
  CHECK(f.admit("Module.b.Seq.forward.0"));
  f.enter_module("Module.b.0.Linear.forward.0");
  CHECK(f.admit("Module.b.0.Linear.forward.0"));  // inside the end module: still in range
  f.exit_module("Module.b.0.Linear.forward.0");
  f.exit_module("Module.b.Seq.forward.0");
  CHECK_FALSE(f.admit("Module.c.Linear.forward.0"));
}

TEST_CASE("an L0 module range without module notifications closes right after the end name") {
  NameFilter f(config_with(Level::L0, {"Module.a.Linear.forward.0", "Module.b.Seq.forward.0"}, {}));
  CHECK(f.admit("Module.a.Linear.forward.0"));
  CHECK(f.admit("Module.b.Seq.forward.0"));
  CHECK_FALSE(f.admit("Module.b.0.Linear.forward.0"));
}

TEST_CASE("in mix, a module matching the list admits everything executed inside it") {
  NameFilter f(config_with(Level::Mix, {}, {"mlp"}));
  CHECK_FALSE(f.admit("Aten.add.0.forward"));
  f.enter_module("Module.layers.0.mlp.MLP.forward.0");
  CHECK(f.admit("Module.layers.0.mlp.MLP.forward.0"));
  f.enter_module("Module.layers.0.mlp.fc.Linear.forward.0");
  CHECK(f.admit("Aten.addmm.0.forward"));
  f.exit_module("Module.layers.0.mlp.fc.Linear.forward.0");
  CHECK(f.admit("Aten.gelu.0.forward"));  // the outer matching module is still running
  f.exit_module("Module.layers.0.mlp.MLP.forward.0");
  CHECK_FALSE(f.admit("Aten.add.1.forward"));
}

TEST_CASE("free_benchmark treats scope as a set of exact names") {
  NameFilter f(config_with(Level::L1, {"Aten.relu.0.forward", "Aten.addmm.0.backward"}, {}, RiskLevel::All,
                           Task::FreeBenchmark));
  CHECK(admitted(f, kRun) == std::vector<std::string>{"Aten.relu.0.forward", "Aten.addmm.0.backward"});
}

TEST_CASE("risk level ALL admits every op") {
  const NameFilter f(config_with(Level::L1, {}, {}, RiskLevel::All));
  for (const char* op : {"view", "addmm", "add", "cat", "_to_copy"}) CHECK(f.admits_op(op));
}

TEST_CASE("risk level FOCUS drops low-risk ops and keeps the rest") {
  const NameFilter f(config_with(Level::L1, {}, {}, RiskLevel::Focus));
  for (const char* op : {"view",         "reshape",    "_reshape_alias",
                         "transpose",    "t",          "permute",
                         "expand",       "squeeze",    "unsqueeze_",
                         "flatten",      "contiguous", "clone",
                         "cat",          "stack",      "split",
                         "chunk",        "to",         "_to_copy",
                         "type_as",      "clamp",      "zeros",
                         "ones",         "full",       "arange",
                         "empty",        "slice",      "select",
                         "index_select", "detach",     "copy_",
                         "fill_",        "zero_",      "aten::view.default"}) {
    INFO(op);
    CHECK_FALSE(f.admits_op(op));
  }
  for (const char* op :
       {"addmm", "add", "mul_", "relu", "gelu", "sum", "mean", "exp", "softmax", "layer_norm", "__and__"}) {
    INFO(op);
    CHECK(f.admits_op(op));
  }
}

TEST_CASE("risk level CORE keeps only the matmul, linear, conv, norm, embedding, attention and softmax families") {
  const NameFilter f(config_with(Level::Mix, {}, {}, RiskLevel::Core));
  for (const char* op : {"matmul",
                         "mm",
                         "bmm",
                         "addmm",
                         "addmm_",
                         "baddbmm",
                         "linear",
                         "conv2d",
                         "conv_transpose1d",
                         "convolution",
                         "_convolution",
                         "cudnn_convolution",
                         "batch_norm",
                         "native_batch_norm",
                         "layer_norm",
                         "native_layer_norm",
                         "group_norm",
                         "native_group_norm",
                         "embedding",
                         "embedding_bag",
                         "scaled_dot_product_attention",
                         "_scaled_dot_product_flash_attention",
                         "softmax",
                         "_softmax",
                         "log_softmax",
                         "aten::addmm.out"}) {
    INFO(op);
    CHECK(f.admits_op(op));
  }
  for (const char* op : {"add", "relu", "view", "norm", "renorm", "normal_", "sum", "_convert_indices_from_coo_to_csr",
                         "upsample_bilinear2d", "cat"}) {
    INFO(op);
    CHECK_FALSE(f.admits_op(op));
  }
}

TEST_CASE("risk level does not apply when a scope or a list names what to dump") {
  const NameFilter with_list(config_with(Level::L1, {}, {"view"}, RiskLevel::Core));
  CHECK(with_list.admits_op("view"));
  const NameFilter with_scope(config_with(Level::L1, {"Aten.t.0.forward", "Aten.t.1.forward"}, {}, RiskLevel::Focus));
  CHECK(with_scope.admits_op("view"));
}

TEST_CASE("risk level applies only at levels L1 and mix") {
  CHECK(NameFilter(config_with(Level::L0, {}, {}, RiskLevel::Core)).admits_op("view"));
  CHECK(NameFilter(config_with(Level::L2, {}, {"x"}, RiskLevel::Core)).admits_op("view"));
  CHECK_FALSE(NameFilter(config_with(Level::L1, {}, {}, RiskLevel::Core)).admits_op("view"));
  CHECK_FALSE(NameFilter(config_with(Level::Mix, {}, {}, RiskLevel::Focus)).admits_op("view"));
}

TEST_CASE("a filter built from a parsed configuration uses its scope and list") {
  const Config c =
      parse_config({{"dump_path", "./d"},
                    {"statistics", {{"scope", {"Aten.t.0.forward", "Aten.relu.0.forward"}}, {"list", {"relu"}}}}});
  NameFilter f(c);
  CHECK(admitted(f, kRun) == std::vector<std::string>{"Aten.relu.0.forward"});
}
