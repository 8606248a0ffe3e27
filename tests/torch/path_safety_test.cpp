// Names that reach the file system cannot leave the dump directory (issue 13). The dump_path is
// user configuration: one with a NUL character is refused (ConfigError). Names that come from the
// program -- save() names, module paths and class names, ATen op names of custom operators -- are
// data, not configuration; refusing them would lose the dump of a training run, so they are made
// safe instead (io::safe_component: '/' and NUL become '_', "." and ".." get a '_' in front) and the
// entry's "data_name" gives the file's actual name. msprobe's spec says nothing on either case.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>
#include <torch/library.h>

#include <unistd.h>

#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "test_support.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

std::string proc_dir() { return "proc" + std::to_string(::getpid()); }

// Every file and directory below `root`, relative to it ("d", "d/step0", ...).
std::set<std::string> tree(const std::string& root) {
  std::set<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) out.insert(fs::relative(e.path(), root).string());
  return out;
}

// What a step directory of the tensor task holds besides the tensor files.
std::set<std::string> rank_tree(const std::string& files, const std::set<std::string>& tensors) {
  std::set<std::string> out = {"d", "d/step0", "d/step0/" + proc_dir()};
  const std::string rank = "d/step0/" + proc_dir() + "/";
  std::istringstream in(files);
  for (std::string f; in >> f;) out.insert(rank + f);
  out.insert(rank + "dump_tensor_data");
  for (const std::string& t : tensors) out.insert(rank + "dump_tensor_data/" + t);
  return out;
}

// Each tensor file read back by python: "name: first element" per line, sorted by name.
std::string python_first_values(const std::string& dir) {
  int rc = 0;
  const std::string out = tptest::run_python(
      "import os, torch\n"
      "d = '" +
          dir +
          "'\n"
          "for f in sorted(os.listdir(d)):\n"
          "    print(f + ': ' + str(torch.load(os.path.join(d, f)).flatten()[0].item()))\n",
      &rc);
  CHECK_MESSAGE(rc == 0, out);
  return out;
}

// Restores the working directory when the test ends.
struct InDirectory {
  fs::path old = fs::current_path();
  explicit InDirectory(const std::string& dir) { fs::current_path(dir); }
  ~InDirectory() { fs::current_path(old); }
};

void dump_one_op(const tp::Options& options) {
  tp::Debugger<tp::Level::L1, tp::Task::Statistics> dbg(options);
  dbg.start();
  torch::neg(torch::ones({2}));
  dbg.stop();
}

const std::string kNulPath("a\0b", 3);

// A parameter-owning leaf module (found without a guard) whose class name reaches out of the directory.
struct OddLeaf : torch::nn::Module {
  OddLeaf() : torch::nn::Module("../odd/Leaf") { w = register_parameter("w", torch::full({3, 2}, 0.5)); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::matmul(x, w); }
  torch::Tensor w;
};
struct Holder : torch::nn::Module {
  Holder() { leaf = register_module("leaf", std::make_shared<OddLeaf>()); }
  std::shared_ptr<OddLeaf> leaf;
};

}  // namespace

TEST_CASE(
    "a dump_path with a NUL character is refused before anything is created, in the working directory or elsewhere") {
  tptest::TempDir tmp;
  InDirectory cwd(tmp.path());
  CHECK_THROWS_WITH_AS(dump_one_op(tp::Options().dump_path(kNulPath)),
                       "config key \"dump_path\": \"a\\u0000b\" is invalid: it contains a NUL character "
                       "(allowed: a non-empty string without NUL characters naming the dump directory)",
                       tp::ConfigError);
  CHECK_THROWS_WITH_AS(dump_one_op(tp::Options().dump_path(tmp / kNulPath)), doctest::Contains("NUL character"),
                       tp::ConfigError);
  std::ofstream("config.json") << R"({"task": "statistics", "level": "L1", "dump_path": "a\u0000b"})";
  CHECK_THROWS_WITH_AS(dump_one_op(tp::Options().config_file("config.json")), doctest::Contains("\"a\\u0000b\""),
                       tp::ConfigError);
  CHECK_THROWS_WITH_AS(tp::PrecisionDebugger("config.json"), doctest::Contains("NUL character"), tp::ConfigError);
  CHECK(tree(tmp.path()) == std::set<std::string>{"config.json"});  // no directory "a"
}

TEST_CASE("save() names with '..', '/' or NUL stay inside dump_tensor_data, and debug.json names the files") {
  tptest::TempDir tmp;
  {
    tp::Debugger<tp::Level::Debug, tp::Task::Tensor> dbg(tp::Options().dump_path(tmp / "d"));
    dbg.save(torch::full({2}, 1.0), "../x");
    dbg.save(torch::full({2}, 2.0), "a/b");
    dbg.save(torch::full({2}, 3.0), std::string("n\0ul", 4));
    dbg.save(torch::full({2}, 4.0), "..");
    dbg.save(torch::full({2}, 5.0), "/abs");
    dbg.save(tp::SaveValue::dict({{"../../k", torch::full({2}, 6.0)}}), "dict");
  }
  const std::string rank = tmp / ("d/step0/" + proc_dir());
  const std::set<std::string> tensors = {".._x.0.debug.pt", "a_b.0.debug.pt",  "n_ul.0.debug.pt",
                                         "...0.debug.pt",   "_abs.0.debug.pt", "dict.0.debug..._.._k.pt"};
  CHECK(tree(tmp.path()) == rank_tree("debug.json", tensors));
  // The entries keep the names the program gave; data_name is the file that holds the tensor.
  const Json data = tptest::read_json(rank + "/debug.json")["data"];
  const std::map<std::string, std::string> files = {{"../x.0.debug", ".._x.0.debug.pt"},
                                                    {"a/b.0.debug", "a_b.0.debug.pt"},
                                                    {std::string("n\0ul.0.debug", 12), "n_ul.0.debug.pt"},
                                                    {"...0.debug", "...0.debug.pt"},
                                                    {"/abs.0.debug", "_abs.0.debug.pt"}};
  for (const auto& [entry, file] : files) {
    CAPTURE(entry);
    REQUIRE(data.contains(entry));
    CHECK(data[entry]["data_name"] == file);
  }
  CHECK(data["dict.0.debug"]["../../k"]["data_name"] == "dict.0.debug..._.._k.pt");
  CHECK(python_first_values(rank + "/dump_tensor_data") ==
        "...0.debug.pt: 4.0\n.._x.0.debug.pt: 1.0\n_abs.0.debug.pt: 5.0\na_b.0.debug.pt: 2.0\n"
        "dict.0.debug..._.._k.pt: 6.0\nn_ul.0.debug.pt: 3.0\n");
  CHECK_FALSE(fs::exists(rank + "/dump_error_info.log"));  // made safe, not failed
}

TEST_CASE("module names with '..' and '/' (a class name, a module_dump name) stay inside dump_tensor_data") {
  const auto model = std::make_shared<Holder>();
  const auto x = torch::full({1, 3}, 2.0);
  tptest::TempDir tmp;
  {
    tp::Debugger<tp::Level::L0, tp::Task::Tensor> dbg(tp::Options().dump_path(tmp / "d"));
    dbg.start(model);
    model->leaf->forward(x);  // Module.leaf.../odd/Leaf.forward.0, recognised by its parameter
    dbg.stop();
  }
  const std::string rank = tmp / ("d/step0/" + proc_dir());
  CHECK(tree(tmp.path()) ==
        rank_tree("dump.json stack.json construct.json",
                  {"Module.leaf..._odd_Leaf.forward.0.input.0.pt", "Module.leaf..._odd_Leaf.forward.0.output.0.pt",
                   "Module.leaf..._odd_Leaf.forward.0.parameters.w.pt"}));
  const Json data = tptest::read_json(rank + "/dump.json")["data"];
  CHECK(data["Module.leaf.../odd/Leaf.forward.0"]["output"][0]["data_name"] ==
        "Module.leaf..._odd_Leaf.forward.0.output.0.pt");
  // x @ w: 2 * 0.5 * 3 = 3 in every element.
  CHECK(python_first_values(rank + "/dump_tensor_data") ==
        "Module.leaf..._odd_Leaf.forward.0.input.0.pt: 2.0\nModule.leaf..._odd_Leaf.forward.0.output.0.pt: 3.0\n"
        "Module.leaf..._odd_Leaf.forward.0.parameters.w.pt: 0.5\n");
  CHECK_FALSE(fs::exists(rank + "/dump_error_info.log"));

  tptest::TempDir tmp2;
  torch::nn::Linear fc(torch::nn::LinearOptions(3, 1).bias(false));
  {
    torch::NoGradGuard no_grad;
    fc->weight.fill_(0.25);
  }
  {
    tp::Debugger<tp::Level::L1, tp::Task::Tensor> dbg(tp::Options().dump_path(tmp2 / "d"));
    dbg.start();
    {
      tp::ScopedModuleDump only(fc, "../../m");  // Module.../../m.Linear.forward.0
      fc->forward(x);
    }
    dbg.stop();
  }
  const std::string rank2 = tmp2 / ("d/step0/" + proc_dir());
  CHECK(tree(tmp2.path()) ==
        rank_tree("dump.json stack.json construct.json",
                  {"Module..._.._m.Linear.forward.0.input.0.pt", "Module..._.._m.Linear.forward.0.output.0.pt",
                   "Module..._.._m.Linear.forward.0.parameters.weight.pt"}));
  const Json data2 = tptest::read_json(rank2 + "/dump.json")["data"];
  CHECK(data2["Module.../../m.Linear.forward.0"]["input_args"][0]["data_name"] ==
        "Module..._.._m.Linear.forward.0.input.0.pt");
  // 2 * 0.25 * 3 = 1.5
  CHECK(python_first_values(rank2 + "/dump_tensor_data") ==
        "Module..._.._m.Linear.forward.0.input.0.pt: 2.0\nModule..._.._m.Linear.forward.0.output.0.pt: 1.5\n"
        "Module..._.._m.Linear.forward.0.parameters.weight.pt: 0.25\n");
  CHECK_FALSE(fs::exists(rank2 + "/dump_error_info.log"));
}

namespace {

// Custom operators in the aten namespace (so that they are recorded as APIs) whose names reach
// out of the directory; registered for the test only and removed with the Library.
struct OddOps {
  torch::Library lib{torch::Library::FRAGMENT, "aten", c10::nullopt, __FILE__, __LINE__};
  OddOps() {
    lib.def(c10::OperatorName("aten::../../tp_escape", ""), [](const at::Tensor& t) { return t * 2; });
    lib.def(c10::OperatorName("aten::tp/slash", ""), [](const at::Tensor& t) { return t * 3; });
  }
  static at::Tensor call(const char* name, const at::Tensor& t) {
    return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<at::Tensor(const at::Tensor&)>().call(t);
  }
};

}  // namespace

TEST_CASE(
    "custom operators whose names hold '..' and '/' stay inside dump_tensor_data, in the tensor and overflow tasks") {
  OddOps ops;
  tptest::TempDir tmp;
  {
    tp::Debugger<tp::Level::L1, tp::Task::Tensor> dbg(tp::Options().dump_path(tmp / "d"));
    const at::Tensor x = torch::full({2}, 1.5);
    dbg.start();
    const at::Tensor y = OddOps::call("aten::../../tp_escape", x);
    const at::Tensor z = OddOps::call("aten::tp/slash", y);
    dbg.stop();
    CHECK(z.equal(torch::full({2}, 9.0)));  // the ops ran as registered
  }
  const std::string rank = tmp / ("d/step0/" + proc_dir());
  const std::set<std::string> tensors = {"Aten..._.._tp_escape.0.forward.input.0.pt",
                                         "Aten..._.._tp_escape.0.forward.output.0.pt",
                                         "Aten.tp_slash.0.forward.input.0.pt", "Aten.tp_slash.0.forward.output.0.pt"};
  CHECK(tree(tmp.path()) == rank_tree("dump.json stack.json construct.json", tensors));
  const Json data = tptest::read_json(rank + "/dump.json")["data"];
  CHECK(data["Aten.../../tp_escape.0.forward"]["output"][0]["data_name"] ==
        "Aten..._.._tp_escape.0.forward.output.0.pt");
  CHECK(data["Aten.tp/slash.0.forward"]["input_args"][0]["data_name"] == "Aten.tp_slash.0.forward.input.0.pt");
  CHECK(python_first_values(rank + "/dump_tensor_data") ==
        "Aten..._.._tp_escape.0.forward.input.0.pt: 1.5\nAten..._.._tp_escape.0.forward.output.0.pt: 3.0\n"
        "Aten.tp_slash.0.forward.input.0.pt: 3.0\nAten.tp_slash.0.forward.output.0.pt: 9.0\n");
  CHECK_FALSE(fs::exists(rank + "/dump_error_info.log"));

  // The overflow task names its files in its own code path.
  tptest::TempDir tmp2;
  {
    tp::Debugger<tp::Level::L1, tp::Task::OverflowCheck> dbg(tp::Options().dump_path(tmp2 / "d").overflow_nums(-1));
    const at::Tensor inf = torch::full({2}, std::numeric_limits<float>::infinity());
    dbg.start();
    OddOps::call("aten::../../tp_escape", inf);
    dbg.stop();
  }
  const std::string rank2 = tmp2 / ("d/step0/" + proc_dir());
  CHECK(tree(tmp2.path()) ==
        rank_tree("dump.json stack.json construct.json overflow_summary.json",
                  {"Aten..._.._tp_escape.0.forward.input.0.pt", "Aten..._.._tp_escape.0.forward.output.0.pt"}));
  CHECK(python_first_values(rank2 + "/dump_tensor_data") ==
        "Aten..._.._tp_escape.0.forward.input.0.pt: inf\nAten..._.._tp_escape.0.forward.output.0.pt: inf\n");
}
