// Behaviours that existed without a test asserting them (issue 44): overflow_check at L0, a
// ScopedModuleDump of a container, list-argument file names, run_ut's black_list, free_benchmark's
// to_cpu fix and a tuple output's output_index, save() of a tuple and without backward, a mix list
// naming a module and an L0 module scope. Each against values worked out here: by hand, by ATen in
// float64, or read back by python3 (json, csv, torch.load).
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>
#include <torchprobe/analysis/run_ut/runner.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace tp = torchprobe;
namespace ru = torchprobe::run_ut;
using Json = nlohmann::ordered_json;

namespace {

using FreeBenchmark = tp::Debugger<tp::Level::L1, tp::Task::FreeBenchmark>;

std::string proc_dir() { return "proc" + std::to_string(::getpid()); }

std::vector<std::string> names_of(const Json& object) {
  std::vector<std::string> names;
  for (auto it = object.begin(); it != object.end(); ++it) names.push_back(it.key());
  return names;
}

// A dump.json tensor item against ATen's statistics of `t` in float64, and its requires_grad.
void check_item_is(const Json& item, const at::Tensor& t, bool requires_grad) {
  tptest::check_item_is(item, t);
  CHECK(item.value("requires_grad", !requires_grad) == requires_grad);
}

using tptest::read_python_json;

// The rows of a CSV as Python's csv module reads them (a BOM, as run_ut writes, dropped).
Json csv_rows(const std::string& path) {
  int rc = 0;
  const std::string out = tptest::run_python(
      "import csv, json\nprint(json.dumps(list(csv.reader(open('" + path + "', newline='', encoding='utf-8-sig')))))\n",
      &rc);
  REQUIRE_MESSAGE(rc == 0, out);
  return Json::parse(out);
}

Json row_named(const Json& rows, const std::string& name) {
  for (const Json& r : rows)
    if (!r.empty() && r[0] == name) return r;
  return Json();
}

// Two Linear children fed the same input: `big` (weights 1e38) overflows fp32, `ok` does not.
struct TwoPathsImpl : torch::nn::Module {
  TwoPathsImpl()
      : ok(register_module("ok", torch::nn::Linear(4, 3))), big(register_module("big", torch::nn::Linear(4, 3))) {
    torch::NoGradGuard no_grad;
    big->weight.fill_(1e38);
    big->bias.zero_();
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor a = ok(x);
    const torch::Tensor b = big(x);  // 4 * 1e38 > 3.4e38: inf
    return a + b;
  }
  torch::nn::Linear ok, big;
};
TORCH_MODULE(TwoPaths);

// Two Linear children in a chain: b(a(x)).
struct ChainImpl : torch::nn::Module {
  ChainImpl() : a(register_module("a", torch::nn::Linear(4, 3))), b(register_module("b", torch::nn::Linear(3, 2))) {}
  torch::Tensor forward(const torch::Tensor& x) { return b(a(x)); }
  torch::nn::Linear a, b;
};
TORCH_MODULE(Chain);

// A custom operator whose result moves at every call (a call counter added): the one kind of call
// whose re-run as it is (pert_mode no_change) can differ from the original.
std::atomic<int> drift_calls{0};
at::Tensor drift(const at::Tensor& x) { return x + static_cast<double>(drift_calls++); }
TORCH_LIBRARY(tpdrift, m) { m.def("drift(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(tpdrift, CPU, m) { m.impl("drift", drift); }

}  // namespace

TEST_CASE("overflow_check at L0 writes the module whose forward output overflows, and not the finite one") {
  tptest::TempDir tmp;
  torch::manual_seed(0);
  TwoPaths model;
  {
    tp::Debugger<tp::Level::L0, tp::Task::OverflowCheck> dbg(tp::Options().dump_path(tmp.path()).overflow_nums(-1));
    torch::NoGradGuard no_grad;  // forward only: no backward entries waiting
    {
      tp::ScopedDump scope(dbg, model);
      static_cast<void>(model->forward(torch::ones({2, 4})));
    }
    dbg.wait_written();
  }
  const std::string dir = tmp / ("step0/" + proc_dir());
  Json dump = read_python_json(dir + "/dump.json");
  REQUIRE(names_of(dump["data"]) == std::vector<std::string>{"Module.big.Linear.forward.0"});
  CHECK_FALSE(dump["data"].contains("Module.ok.Linear.forward.0"));
  Json& e = dump["data"]["Module.big.Linear.forward.0"];
  CHECK(e["input_args"][0]["Max"] == 1.0);
  CHECK(e["parameters"]["weight"]["Max"] == static_cast<double>(1e38f));
  CHECK(e["output"][0]["Max"] == "Infinity");
  CHECK(e["output"][0]["data_name"] == "Module.big.Linear.forward.0.output.0.pt");
  int rc = 0;
  const std::string out = tptest::run_python("import torch\nt = torch.load('" + dir +
                                                 "/dump_tensor_data/Module.big.Linear.forward.0.output.0.pt')\n"
                                                 "print(list(t.shape), t.isinf().all().item())\n",
                                             &rc);
  CHECK_MESSAGE(rc == 0, out);
  CHECK(out == "[2, 3] True\n");
  CHECK(tptest::read_json(dir + "/overflow_summary.json")["origin"] == "Module.big.Linear.forward.0");
}

TEST_CASE("ScopedModuleDump of a Sequential with its inputs writes the container's entry with their statistics") {
  tptest::TempDir tmp;
  torch::manual_seed(2);
  torch::nn::Sequential seq(torch::nn::Linear(4, 5), torch::nn::ReLU());
  const at::Tensor x = torch::randn({3, 4});
  at::Tensor y;
  {
    tp::Debugger<tp::Level::L1, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp.path()).extra_info(false));
    torch::NoGradGuard no_grad;  // forward only
    dbg.start();
    {
      tp::ScopedModuleDump only(seq, "seq", x);
      y = seq->forward(x);  // the output: the last call's (relu's) result
    }
    dbg.stop();
    dbg.wait_written();
  }
  Json data = tptest::read_json(tmp / ("step0/" + proc_dir() + "/dump.json"))["data"];
  REQUIRE(names_of(data) == std::vector<std::string>{"Module.seq.Sequential.forward.0"});  // no API entries
  Json& e = data["Module.seq.Sequential.forward.0"];
  CHECK(names_of(e) == std::vector<std::string>{"input_args", "input_kwargs", "output"});
  REQUIRE(e["input_args"].size() == 1);
  REQUIRE(e["output"].size() == 1);
  check_item_is(e["input_args"][0], x, false);
  check_item_is(e["output"][0], y, false);
}

TEST_CASE("the tensor task names a list argument's files input.{arg}.{item}: torch::cat({a, b}) at L1") {
  tptest::TempDir tmp;
  const at::Tensor a = torch::tensor({1.5f, -2.0f, 3.0f, 4.25f}).reshape({2, 2});
  const at::Tensor b = torch::tensor({-0.5f, 8.0f}).reshape({1, 2});
  {
    tp::Debugger<tp::Level::L1, tp::Task::Tensor> dbg(tp::Options().dump_path(tmp.path()));
    dbg.start();
    static_cast<void>(torch::cat({a, b}));
    dbg.stop();
    dbg.wait_written();
  }
  const std::string dir = tmp / ("step0/" + proc_dir());
  Json cat = tptest::read_json(dir + "/dump.json")["data"]["Aten.cat.0.forward"];
  REQUIRE(cat.is_object());
  REQUIRE(cat["input_args"][0].size() == 2);
  CHECK(cat["input_args"][0][0]["data_name"] == "Aten.cat.0.forward.input.0.0.pt");
  CHECK(cat["input_args"][0][1]["data_name"] == "Aten.cat.0.forward.input.0.1.pt");
  int rc = 0;
  const std::string out = tptest::run_python("import torch\nd = '" + dir +
                                                 "/dump_tensor_data/'\n"
                                                 "for f in ('input.0.0', 'input.0.1', 'output.0'):\n"
                                                 "    t = torch.load(d + 'Aten.cat.0.forward.' + f + '.pt')\n"
                                                 "    print(t.dtype, t.tolist())\n",
                                             &rc);
  CHECK_MESSAGE(rc == 0, out);
  CHECK(out ==
        "torch.float32 [[1.5, -2.0], [3.0, 4.25]]\n"
        "torch.float32 [[-0.5, 8.0]]\n"
        "torch.float32 [[1.5, -2.0], [3.0, 4.25], [-0.5, 8.0]]\n");
}

TEST_CASE("run_ut's black_list SKIPs the listed API with msprobe's message and still replays the others") {
  tptest::TempDir tmp;
  const at::Tensor x = torch::linspace(-1, 1, 8);
  {
    tp::Debugger<tp::Level::L1, tp::Task::Tensor> dbg(tp::Options().dump_path(tmp / "dump"));
    dbg.start();
    static_cast<void>(torch::relu(x));
    static_cast<void>(torch::neg(x));
    dbg.stop();
    dbg.wait_written();
  }
  ru::RunOptions o;
  o.api_info = tmp / ("dump/step0/" + proc_dir() + "/dump.json");
  o.out_dir = tmp / "all";
  const ru::RunOutput all = ru::run(o);  // the control: without the black list relu passes
  o.out_dir = tmp / "listed";
  o.black_list = {"relu"};
  const ru::RunOutput listed = ru::run(o);

  const Json all_rows = csv_rows(all.result_csv), listed_rows = csv_rows(listed.result_csv);
  CAPTURE(all_rows.dump());
  CAPTURE(listed_rows.dump());
  REQUIRE(row_named(all_rows, "Aten.relu.0").is_array());
  CHECK(row_named(all_rows, "Aten.relu.0")[1] == "pass");
  CHECK(row_named(listed_rows, "Aten.relu.0") ==
        Json{"Aten.relu.0", "SKIP", "SKIP", "API relu in black list or not in white list. SKIP."});
  REQUIRE(row_named(listed_rows, "Aten.neg.0").is_array());
  CHECK(row_named(listed_rows, "Aten.neg.0")[1] == "pass");
  for (const auto& r : listed.results) {
    CAPTURE(r.name);
    CHECK(r.device_out.empty() == (r.name == "Aten.relu.0"));  // the listed API was not run
  }
}

TEST_CASE("free_benchmark fix with to_cpu: an overflowing fp16 mse_loss takes the CPU's result cast to fp16") {
  // 50 squared errors of 300 (90000, beyond fp16) over 100 elements: 45000 in float64, which fp16
  // (a step of 32 between 32768 and 65536) rounds to 44992.
  const at::Tensor x = at::cat({torch::full({50}, 300.0, torch::kHalf), torch::zeros({50}, torch::kHalf)});
  const at::Tensor y = torch::zeros({100}, torch::kHalf);
  auto loss_of = [&] { return at::mse_loss(x, y).to(torch::kFloat) * 2; };
  REQUIRE(std::isinf(loss_of().item<float>()));
  const float reference =
      at::mse_loss(x.to(torch::kDouble), y.to(torch::kDouble)).to(torch::kHalf).to(torch::kFloat).item<float>() * 2;
  CHECK(reference == 2 * 44992.0f);
  tptest::TempDir tmp;
  at::Tensor loss;
  {
    FreeBenchmark dbg(tp::Options()
                          .dump_path(tmp.path())
                          .set("pert_mode", "to_cpu")
                          .set("fuzz_device", "cpu")
                          .set("handler_type", "fix"));
    dbg.start();
    loss = loss_of();
    dbg.stop();
    dbg.step();
    dbg.wait_written();
  }
  CHECK(loss.item<float>() == reference);
  // The comparison is still reported, as a to_cpu row: the original's inf against the CPU's 45000.
  const Json rows = csv_rows(tmp / ("step0/" + proc_dir() + "/free_benchmark.csv"));
  CAPTURE(rows.dump());
  REQUIRE(rows.size() == 2);
  CHECK(rows[1] ==
        Json{"0", "to_cpu", "forward", "0", "Aten.mse_loss.0.forward", "", "torch.float16", "torch.Size([])", ""});
}

TEST_CASE("improve_precision: a tuple output whose first element overflows fp16 gives a row with output_index 0") {
  // var_mean of fp16 [60000, -60000, 60000, -60000]: the variance 4 * 3.6e9 / 3 = 4.8e9 overflows
  // fp16 (not fp32), the mean 0 is exact in both.
  const at::Tensor x = torch::tensor({60000.0, -60000.0, 60000.0, -60000.0}).to(torch::kHalf);
  const auto [var64, mean64] = torch::var_mean(x.to(torch::kDouble));
  REQUIRE(var64.item<double>() == doctest::Approx(4.8e9));
  REQUIRE(var64.item<double>() > 65504.0);  // fp16's largest value
  REQUIRE(mean64.item<double>() == 0.0);
  const auto [var16, mean16] = torch::var_mean(x);
  REQUIRE(std::isinf(var16.item<float>()));
  REQUIRE(mean16.item<float>() == 0.0f);
  tptest::TempDir tmp;
  {
    FreeBenchmark dbg(tp::Options().dump_path(tmp.path()));  // improve_precision, check
    dbg.start();
    static_cast<void>(torch::var_mean(x));
    dbg.stop();
    dbg.step();
    dbg.wait_written();
  }
  const Json rows = csv_rows(tmp / ("step0/" + proc_dir() + "/free_benchmark.csv"));
  CAPTURE(rows.dump());
  REQUIRE(rows.size() == 2);  // the header and the variance: the mean is consistent
  CHECK(rows[0][8] == "output_index");
  const Json& r = rows[1];
  CHECK(r[4].get<std::string>().rfind("Aten.var_mean.", 0) == 0);
  CHECK(r[1] == "improve_precision");
  CHECK(r[6] == "torch.float16");
  CHECK(r[7] == "torch.Size([])");
  CHECK(r[8] == "0");
  // inf against 4.8e9: nan_to_num makes the ratio fp32's largest value, and ratio - 1 is that too.
  CHECK(std::stod(r[5].get<std::string>()) == static_cast<double>(std::numeric_limits<float>::max()));
}

TEST_CASE("save() with save_backward false writes no gradient entry for a tensor that requires grad; true does") {
  tptest::TempDir tmp;
  const at::Tensor x1 = torch::tensor({0.5f, -1.0f, 2.0f, 3.0f, -0.25f, 1.5f}).reshape({2, 3}).requires_grad_();
  const at::Tensor x2 = torch::tensor({1.0f, -2.0f, 0.75f}).requires_grad_();
  const at::Tensor w = torch::tensor({3.0f, -1.0f, 0.5f, 2.0f, 4.0f, -6.0f}).reshape({2, 3});
  const at::Tensor v = torch::tensor({-5.0f, 0.25f, 9.0f});
  {
    tp::Debugger<tp::Level::Debug, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp.path()));
    const at::Tensor y = x1 * 2;
    const at::Tensor z = x2 * 3;
    dbg.save(y, "y", /*save_backward=*/false);
    dbg.save(z, "z", /*save_backward=*/true);    // the control
    ((y * w).sum() + (z * v).sum()).backward();  // dy = w, dz = v
    dbg.step();
    dbg.wait_written();
  }
  Json d = tptest::read_json(tmp / ("step0/" + proc_dir() + "/debug.json"))["data"];
  CHECK(names_of(d) == std::vector<std::string>{"y.0.debug", "z.0.debug", "z_grad.0.debug"});
  CHECK_FALSE(d.contains("y_grad.0.debug"));
  check_item_is(d["y.0.debug"], x1.detach() * 2, true);
  check_item_is(d["z.0.debug"], x2.detach() * 3, true);
  check_item_is(d["z_grad.0.debug"], v, false);
}

TEST_CASE("save() of a tuple writes one item per element, in order, with each tensor's shape and statistics") {
  tptest::TempDir tmp;
  const at::Tensor a = torch::arange(6, torch::kFloat).reshape({2, 3});                        // Max 5
  const at::Tensor b = torch::tensor({-1.0, 7.5, 2.0}, torch::TensorOptions(torch::kDouble));  // Max 7.5
  {
    tp::Debugger<tp::Level::Debug, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp.path()));
    const c10::IValue tuple(c10::ivalue::Tuple::create(std::vector<c10::IValue>{a, b, c10::IValue(int64_t{3})}));
    dbg.save(tuple, "tup");
    dbg.step();
    dbg.wait_written();
  }
  Json d = tptest::read_json(tmp / ("step0/" + proc_dir() + "/debug.json"))["data"];
  Json t = d["tup.0.debug"];
  CAPTURE(t.dump());
  REQUIRE(t.is_array());
  REQUIRE(t.size() == 3);
  CHECK(t[0]["dtype"] == "torch.float32");
  CHECK(t[0]["shape"] == Json::parse("[2, 3]"));
  CHECK(t[0]["Max"] == 5.0);
  check_item_is(t[0], a, false);
  CHECK(t[1]["dtype"] == "torch.float64");
  CHECK(t[1]["shape"] == Json::parse("[3]"));
  CHECK(t[1]["Max"] == 7.5);
  check_item_is(t[1], b, false);
  CHECK(t[2] == Json::parse(R"({"type": "int", "value": 3})"));
  // save_backward (the default): the gradient entry has the same structure, every leaf null.
  CHECK(d["tup_grad.0.debug"] == Json::parse("[null, null, null]"));
}

TEST_CASE("mix: a list naming a module switches on the calls inside it; the calls outside stay off") {
  auto names_with = [](tp::Options opts) {
    tptest::TempDir tmp;
    torch::manual_seed(1234);
    tptest::Net net;
    const at::Tensor x = torch::randn({2, 8});
    {
      tp::Debugger<tp::Level::Mix, tp::Task::Statistics> dbg(opts.dump_path(tmp.path()).extra_info(false));
      torch::NoGradGuard no_grad;  // forward only
      {
        tp::ScopedDump scope(dbg, net);
        static_cast<void>(net->forward(x));
      }
      dbg.wait_written();
    }
    return names_of(tptest::read_json(tmp / ("step0/" + proc_dir() + "/dump.json"))["data"]);
  };
  const std::vector<std::string> all = names_with(tp::Options());
  CHECK(std::find(all.begin(), all.end(), "Aten.relu.0.forward") != all.end());  // the control
  const std::vector<std::string> listed = names_with(tp::Options().list({"fc"}));
  CHECK(listed == std::vector<std::string>{"Aten.t.0.forward", "Aten.addmm.0.forward", "Module.fc.Linear.forward.0"});
}

TEST_CASE("L0: a scope of one module's forward name [start, end] writes only that module's entries") {
  auto run = [](tp::Options opts, Json* data) {
    tptest::TempDir tmp;
    torch::manual_seed(21);
    Chain model;
    const at::Tensor x = torch::randn({5, 4});
    {
      tp::Debugger<tp::Level::L0, tp::Task::Statistics> dbg(opts.dump_path(tmp.path()).extra_info(false));
      torch::NoGradGuard no_grad;  // forward only
      {
        tp::ScopedDump scope(dbg, model);
        static_cast<void>(model->forward(x));
      }
      dbg.wait_written();
    }
    *data = tptest::read_json(tmp / ("step0/" + proc_dir() + "/dump.json"))["data"];
    torch::NoGradGuard no_grad;
    return model->a(x);  // what the first child returned
  };
  Json all, scoped;
  run(tp::Options(), &all);
  CHECK(names_of(all) == std::vector<std::string>{"Module.a.Linear.forward.0", "Module.b.Linear.forward.0"});
  const at::Tensor a_out =
      run(tp::Options().scope({"Module.a.Linear.forward.0", "Module.a.Linear.forward.0"}), &scoped);
  REQUIRE(names_of(scoped) == std::vector<std::string>{"Module.a.Linear.forward.0"});
  check_item_is(scoped["Module.a.Linear.forward.0"]["output"][0], a_out, false);
}

TEST_CASE("no_change re-runs each call as it is, with threshold 1.0: only a call whose re-run differs is listed") {
  const auto drift_op =
      c10::Dispatcher::singleton().findSchemaOrThrow("tpdrift::drift", "").typed<at::Tensor(const at::Tensor&)>();
  const at::Tensor x = torch::full({4}, 3.0f);
  tptest::TempDir tmp;
  at::Tensor drifted, exact;
  drift_calls = 0;
  {
    FreeBenchmark dbg(tp::Options().dump_path(tmp.path()).set("pert_mode", "no_change"));
    dbg.start();
    exact = torch::mul(x, 1.5);  // deterministic: its re-run is equal, ratio 1, not listed
    drifted = drift_op.call(x);  // re-run first (3 + 0), then the call itself (3 + 1)
    dbg.stop();
    dbg.step();
    dbg.wait_written();
  }
  CHECK(drift_calls == 2);                  // the call and its one re-run
  CHECK(drifted[0].item<float>() == 4.0f);  // check mode: the caller keeps the original output
  CHECK(exact[0].item<float>() == 4.5f);
  const Json rows = csv_rows(tmp / ("step0/" + proc_dir() + "/free_benchmark.csv"));
  CAPTURE(rows.dump());
  REQUIRE(rows.size() == 2);
  // 4 against 3: ratio 4/3 > 1.0; msprobe's max_rel column holds the ratio less 1.
  CHECK(rows[1][1] == "no_change");
  CHECK(rows[1][4] == "Tpdrift.drift.0.forward");
  CHECK(std::stod(rows[1][5].get<std::string>()) == doctest::Approx(1.0 / 3.0));
}
