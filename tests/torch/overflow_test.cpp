// Task::OverflowCheck: only calls with a non-finite Max/Min are written, with their tensors as .pt
// files; overflow_nums ends the dump; overflow_summary.json names the call where inf/NaN first
// appeared. Files are read back by python3 (json that allows Infinity/NaN, torch.load).
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <filesystem>
#include <iostream>
#include <sstream>
#include <thread>

#include "test_support.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

template <tp::Level L, class Sink = tp::DirectorySink>
using Overflow = tp::Debugger<L, tp::Task::OverflowCheck, Sink>;

std::string rank_dir(const std::string& dump, int step = 0) {
  return dump + "/step" + std::to_string(step) + "/proc" + std::to_string(::getpid());
}

using tptest::read_python_json;

std::vector<std::string> keys_of(const Json& object) {
  std::vector<std::string> keys;
  for (auto it = object.begin(); it != object.end(); ++it) keys.push_back(it.key());
  return keys;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  if (!fs::exists(dir)) return names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// fc (weights 1, bias 0) of ones gives 8 everywhere: finite in fp32 and fp16. Then, in fp16,
// "* 10000" overflows (80000 > 65504) -- the planted op -- and "+ 1" and sum() carry the inf on.
// The backward pass stays finite (its gradients are 1 and 10000).
struct ForwardOverflowImpl : torch::nn::Module {
  ForwardOverflowImpl() : fc(register_module("fc", torch::nn::Linear(8, 4))) {
    torch::NoGradGuard no_grad;
    fc->weight.fill_(1.0);
    fc->bias.zero_();
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor h = fc(x).to(torch::kHalf);
    return (h * 10000 + 1).sum();
  }
  torch::nn::Linear fc;
};
TORCH_MODULE(ForwardOverflow);

// Forward finite (x * w = 60, sum 240, * 4 = 960), but the gradient of x is 4 * 60000 = 240000,
// beyond fp16: only Aten.mul.0.backward makes an inf.
torch::Tensor backward_only_overflow() {
  const torch::Tensor x = torch::full({4}, 1e-3, torch::kHalf).requires_grad_();
  const torch::Tensor w = torch::full({4}, 60000.0, torch::kHalf);
  const torch::Tensor loss = (x * w).sum() * 4;
  loss.backward();
  return x.grad();
}

// A guarded block whose exp overflows in fp32 (fc(ones) = 120, exp(120) > 3.4e38).
struct ExpBlockImpl : torch::nn::Module {
  ExpBlockImpl() : fc(register_module("fc", torch::nn::Linear(4, 4))) {
    torch::NoGradGuard no_grad;
    fc->weight.fill_(30.0);
    fc->bias.zero_();
  }
  torch::Tensor forward(const torch::Tensor& x) {
    tp::ModuleGuard guard(this, x);
    return torch::exp(fc(x));
  }
  torch::nn::Linear fc;
};

struct ExpNetImpl : torch::nn::Module {
  ExpNetImpl() : block(register_module("block", std::make_shared<ExpBlockImpl>())) {}
  torch::Tensor forward(const torch::Tensor& x) { return block->forward(x).sum(); }
  std::shared_ptr<ExpBlockImpl> block;
};

template <class D>
void run_forward_model(D& dbg, ForwardOverflow& model, int steps = 1) {
  const torch::Tensor x = torch::ones({2, 8});
  for (int s = 0; s < steps; ++s) {
    {
      tp::ScopedDump scope(dbg, model);
      model->forward(x).backward();
    }
    dbg.step();
  }
  dbg.wait_written();
}

std::vector<std::string> roles(const Json& summary) {
  std::vector<std::string> out;
  for (const Json& c : summary["calls"])
    out.push_back(c["name"].get<std::string>() + ":" + c["role"].get<std::string>());
  return out;
}

using tptest::stderr_of;

}  // namespace

TEST_CASE(
    "overflow_check at L1: only the calls with a non-finite Max/Min are written, each tensor saved as a .pt torch.load "
    "reads") {
  tptest::TempDir tmp;
  ForwardOverflow model;
  Overflow<tp::Level::L1> dbg(tp::Options().dump_path(tmp.path()).overflow_nums(-1));
  run_forward_model(dbg, model);

  const std::string dir = rank_dir(tmp.path());
  const Json dump = read_python_json(dir + "/dump.json");
  CHECK(keys_of(dump) == std::vector<std::string>{"task", "level", "framework", "dump_data_dir", "data"});
  CHECK(dump["task"] == "overflow_check");
  CHECK(dump["level"] == "L1");
  CHECK(dump["dump_data_dir"] == dir + "/dump_tensor_data");
  // t, addmm, to and every backward entry are finite and leave nothing.
  CHECK(keys_of(dump["data"]) ==
        std::vector<std::string>{"Aten.mul.0.forward", "Aten.add.0.forward", "Aten.sum.0.forward"});

  const Json& mul = dump["data"]["Aten.mul.0.forward"];
  CHECK(keys_of(mul) == std::vector<std::string>{"input_args", "input_kwargs", "output"});
  const Json& in = mul["input_args"][0];
  CHECK(keys_of(in) ==
        std::vector<std::string>{"type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "requires_grad", "data_name"});
  CHECK(in["dtype"] == "torch.float16");
  CHECK(in["Max"] == 8.0);
  CHECK(in["data_name"] == "Aten.mul.0.forward.input.0.pt");
  CHECK(mul["input_args"][1] == Json::parse(R"({"type": "int", "value": 10000})"));
  CHECK(mul["output"][0]["Max"] == "Infinity");
  CHECK(mul["output"][0]["data_name"] == "Aten.mul.0.forward.output.0.pt");
  CHECK(dump["data"]["Aten.add.0.forward"]["input_args"][0]["Min"] == "Infinity");

  CHECK(files_in(dir + "/dump_tensor_data") ==
        std::vector<std::string>{"Aten.add.0.forward.input.0.pt", "Aten.add.0.forward.output.0.pt",
                                 "Aten.mul.0.forward.input.0.pt", "Aten.mul.0.forward.output.0.pt",
                                 "Aten.sum.0.forward.input.0.pt", "Aten.sum.0.forward.output.0.pt"});
  int rc = 0;
  const std::string out = tptest::run_python(
      "import torch\n"
      "d = '" +
          dir +
          "/dump_tensor_data/'\n"
          "a = torch.load(d + 'Aten.mul.0.forward.input.0.pt')\n"
          "b = torch.load(d + 'Aten.mul.0.forward.output.0.pt')\n"
          "print(a.dtype, list(a.shape), a.float().unique().tolist(), b.isinf().all().item(), a.requires_grad)\n",
      &rc);
  CHECK_MESSAGE(rc == 0, out);
  CHECK(out == "torch.float16 [2, 4] [8.0] True False\n");

  // stack.json and construct.json name the written calls only.
  const Json stack = tptest::read_json(dir + "/stack.json");
  std::vector<std::string> stacked;
  for (const auto& group : stack)
    for (const auto& n : group[0]) stacked.push_back(n.get<std::string>());
  std::sort(stacked.begin(), stacked.end());
  CHECK(stacked == std::vector<std::string>{"Aten.add.0.forward", "Aten.mul.0.forward", "Aten.sum.0.forward"});
  CHECK(tptest::read_text(dir + "/construct.json") == "{}");

  const Json summary = tptest::read_json(dir + "/overflow_summary.json");
  CHECK(summary["origin"] == "Aten.mul.0.forward");
  CHECK(summary["origin_parent"].is_null());
  CHECK(summary["overflowing_calls"] == 3);
  CHECK(summary["limit_reached"] == false);
  CHECK(roles(summary) == std::vector<std::string>{"Aten.mul.0.forward:origin", "Aten.add.0.forward:propagated",
                                                   "Aten.sum.0.forward:propagated"});
  CHECK(summary["calls"][0]["nonfinite"] == Json::parse(R"(["output.0"])"));
  CHECK(summary["calls"][1]["nonfinite"] == Json::parse(R"(["input.0", "output.0"])"));
  CHECK(!fs::exists(dir + "/" + tp::io::Journal::kFileName));
}

TEST_CASE("an overflow only in backward: the backward entry that made it is written and named as origin") {
  tptest::TempDir tmp;
  Overflow<tp::Level::L1> dbg(tp::Options().dump_path(tmp.path()).overflow_nums(-1));
  torch::Tensor grad;
  {
    tp::ScopedDump scope(dbg);
    grad = backward_only_overflow();
  }
  dbg.wait_written();
  CHECK(grad.isinf().all().item<bool>());
  const std::string dir = rank_dir(tmp.path());
  const Json dump = read_python_json(dir + "/dump.json");
  REQUIRE(keys_of(dump["data"]) == std::vector<std::string>{"Aten.mul.0.backward"});
  const Json& e = dump["data"]["Aten.mul.0.backward"];
  CHECK(e["input"][0]["Max"] == 4.0);  // the gradient flowing in is finite
  CHECK(e["output"][0]["Max"] == "Infinity");
  CHECK(e["output"][0]["data_name"] == "Aten.mul.0.backward.output.0.pt");
  CHECK(e["output"][1].is_null());  // w needs no gradient
  CHECK(files_in(dir + "/dump_tensor_data") ==
        std::vector<std::string>{"Aten.mul.0.backward.input.0.pt", "Aten.mul.0.backward.output.0.pt"});
  int rc = 0;
  const std::string out = tptest::run_python(
      "import torch\n"
      "t = torch.load('" +
          dir +
          "/dump_tensor_data/Aten.mul.0.backward.output.0.pt')\n"
          "print(t.dtype, t.isinf().all().item())\n",
      &rc);
  CHECK_MESSAGE(rc == 0, out);
  CHECK(out == "torch.float16 True\n");
  const Json summary = tptest::read_json(dir + "/overflow_summary.json");
  CHECK(summary["origin"] == "Aten.mul.0.backward");
  CHECK(summary["calls"][0]["nonfinite"] == Json::parse(R"(["output.0"])"));
}

TEST_CASE("the planted op is the origin: a multiply by a large constant, an exp, a matmul of large values") {
  struct Case {
    const char* origin;
    std::function<torch::Tensor()> run;
  };
  const Case cases[] = {
      {"Aten.mul.0.forward", [] { return (torch::full({3}, 30000.0, torch::kHalf) * 4).neg(); }},
      {"Aten.exp.0.forward", [] { return torch::exp(torch::linspace(0, 100, 5)).sum(); }},
      {"Aten.matmul.0.forward",
       [] {
         return torch::matmul(torch::full({2, 3}, 1e20), torch::full({3, 2}, 1e20)).relu();
       }},
  };
  for (const Case& c : cases) {
    CAPTURE(c.origin);
    tptest::TempDir tmp;  // the tensor files still go to dump_path
    Overflow<tp::Level::L1, tp::MemorySink> dbg(tp::Options().dump_path(tmp.path()).overflow_nums(-1));
    {
      tp::ScopedDump scope(dbg);
      (void)c.run();
    }
    const auto& files = dbg.sink().step(0);
    const Json summary = files.json_file("overflow_summary.json");
    CHECK(summary["origin"] == c.origin);
    REQUIRE(summary["calls"].size() == 2);  // the planted op and the one after it
    CHECK(summary["calls"][1]["role"] == "propagated");
    CHECK(files.dump["data"].size() == 2);
  }
}

TEST_CASE("a NaN is an overflow too: 0/0 and sqrt(-1) are written and named as origin, on both paths") {
  struct Case {
    const char* origin;
    std::function<torch::Tensor()> run;
  };
  // Every other planted overflow in this file is an infinity: these make NaN and nothing infinite.
  const Case cases[] = {
      {"Aten.sqrt.0.forward",
       [] {
         return torch::sqrt(torch::tensor({4.0f, -1.0f, 9.0f})) * 2;
       }},
      {"Aten.div.0.forward", [] { return torch::div(torch::zeros({3}), torch::zeros({3})) * 2; }},
  };
  for (const bool device_path : {false, true}) {
    for (const Case& c : cases) {
      CAPTURE(device_path);
      CAPTURE(c.origin);
      tptest::TempDir tmp;
      Overflow<tp::Level::L1, tp::MemorySink> dbg(tp::Options().dump_path(tmp.path()).overflow_nums(-1));
      dbg.task().force_device_path(device_path);
      torch::Tensor out;
      {
        tp::ScopedDump scope(dbg);
        out = c.run();
      }
      REQUIRE(torch::isnan(out).any().item<bool>());
      REQUIRE(!torch::isinf(out).any().item<bool>());
      const auto& files = dbg.sink().step(0);
      const Json summary = files.json_file("overflow_summary.json");
      CHECK(summary["origin"] == c.origin);
      REQUIRE(summary["calls"].size() == 2);  // the planted op and the multiply that carries its NaN
      CHECK(summary["calls"][1]["role"] == "propagated");
      REQUIRE(files.dump["data"].contains(c.origin));
      CHECK(std::isnan(files.dump["data"][c.origin]["output"][0]["Max"].get<double>()));
    }
  }
}

TEST_CASE("-inf in a tensor whose Max stays finite is an overflow: log of a zero among positive values") {
  for (const bool device_path : {false, true}) {
    CAPTURE(device_path);
    tptest::TempDir tmp;
    Overflow<tp::Level::L1, tp::MemorySink> dbg(tp::Options().dump_path(tmp.path()).overflow_nums(-1));
    dbg.task().force_device_path(device_path);
    {
      tp::ScopedDump scope(dbg);
      // log: {-inf, 0, log 2}, Max finite. exp of it is finite again ({0, 1, 2}), but it received
      // the -inf: it is written too, as propagated.
      (void)torch::log(torch::tensor({0.0f, 1.0f, 2.0f})).exp();
    }
    const auto& files = dbg.sink().step(0);
    const Json summary = files.json_file("overflow_summary.json");
    CHECK(summary["origin"] == "Aten.log.0.forward");
    REQUIRE(summary["calls"].size() == 2);
    CHECK(summary["calls"][1]["name"] == "Aten.exp.0.forward");
    CHECK(summary["calls"][1]["role"] == "propagated");
    CHECK(keys_of(files.dump["data"]) == std::vector<std::string>{"Aten.log.0.forward", "Aten.exp.0.forward"});
    const Json out = files.dump["data"]["Aten.log.0.forward"]["output"][0];
    CHECK(out["Max"].get<double>() == doctest::Approx(std::log(2.0)));
    CHECK(out["Min"].get<double>() == -std::numeric_limits<double>::infinity());
  }
}

TEST_CASE("overflow_nums 1: the first overflowing call is written at once, then the dump ends and start() says why") {
  tptest::TempDir tmp;
  ForwardOverflow model;
  Overflow<tp::Level::L1> dbg(tp::Options().dump_path(tmp.path()));  // overflow_nums defaults to 1
  const std::string dir = rank_dir(tmp.path());
  const torch::Tensor x = torch::ones({2, 8});
  {
    tp::ScopedDump scope(dbg, model);
    const torch::Tensor loss = model->forward(x);
    // Written when the overflow happened, before stop(): a run that then crashes keeps its answer.
    REQUIRE(fs::exists(dir + "/dump.json"));
    const Json early = read_python_json(dir + "/dump.json");
    CHECK(keys_of(early["data"]) == std::vector<std::string>{"Aten.mul.0.forward"});
    CHECK(files_in(dir + "/dump_tensor_data") ==
          std::vector<std::string>{"Aten.mul.0.forward.input.0.pt", "Aten.mul.0.forward.output.0.pt"});
    loss.backward();
  }
  const std::string said = stderr_of([&] {
    dbg.step();
    for (int s = 0; s < 2; ++s) {
      {
        tp::ScopedDump scope(dbg, model);
        model->forward(x).backward();
      }
      dbg.step();
    }
  });
  CHECK(said.find("overflow_nums = 1") != std::string::npos);
  CHECK(said.find("start() does nothing") != std::string::npos);
  CHECK(said.find("torchprobe:") == said.rfind("torchprobe:"));  // said once
  CHECK(!dbg.running());
  CHECK(!fs::exists(tmp.path() + "/step1"));
  const Json dump = read_python_json(dir + "/dump.json");
  CHECK(keys_of(dump["data"]) == std::vector<std::string>{"Aten.mul.0.forward"});
  const Json summary = tptest::read_json(dir + "/overflow_summary.json");
  CHECK(summary["origin"] == "Aten.mul.0.forward");
  CHECK(summary["limit_reached"] == true);
  CHECK(dbg.task().overflowing_calls_kept() == 1);
}

TEST_CASE(
    "an overflow on another thread ends the dump there: written before that thread's call returns, nothing captured "
    "after") {
  tptest::TempDir tmp;
  Overflow<tp::Level::L1> dbg(tp::Options().dump_path(tmp.path()));  // overflow_nums 1
  const std::string dir = rank_dir(tmp.path());
  const torch::Tensor big = torch::full({4}, 60000.0).to(torch::kHalf);
  dbg.start();
  bool written_on_return = false;
  std::vector<std::string> tensor_files_on_return;
  std::thread worker([&] {
    const torch::Tensor inf = big * 2;  // 120000 > 65504: the first overflowing call, on this thread
    written_on_return = fs::exists(dir + "/dump.json");
    tensor_files_on_return = files_in(dir + "/dump_tensor_data");
    CHECK(std::isinf(inf[0].item<float>()));
  });
  worker.join();
  // Captured no more, on any thread: another overflowing call before stop() is not an entry.
  (big * 3).sum();
  std::string said = stderr_of([&] { dbg.stop(); });
  CHECK(written_on_return);
  CHECK(tensor_files_on_return ==
        std::vector<std::string>{"Aten.mul.0.forward.input.0.pt", "Aten.mul.0.forward.output.0.pt"});
  const Json dump = read_python_json(dir + "/dump.json");
  CHECK(keys_of(dump["data"]) == std::vector<std::string>{"Aten.mul.0.forward"});
  CHECK(dbg.task().overflowing_calls_kept() == 1);
  said = stderr_of([&] { dbg.start(); });
  CHECK(said.find("overflow_nums = 1") != std::string::npos);
  CHECK(!dbg.running());
}

TEST_CASE("overflow_nums 2 keeps two calls; -1 keeps every overflowing call of every step") {
  SUBCASE("2") {
    ForwardOverflow model;
    tptest::TempDir tmp;
    Overflow<tp::Level::L1, tp::MemorySink> dbg(tp::Options().dump_path(tmp.path()).overflow_nums(2));
    std::string said = stderr_of([&] { run_forward_model(dbg, model, 2); });
    CHECK(keys_of(dbg.sink().step(0).dump["data"]) ==
          std::vector<std::string>{"Aten.mul.0.forward", "Aten.add.0.forward"});
    CHECK(dbg.sink().steps().count(1) == 0);
    CHECK(said.find("overflow_nums = 2") != std::string::npos);
  }
  SUBCASE("-1") {
    ForwardOverflow model;
    tptest::TempDir tmp;
    Overflow<tp::Level::L1, tp::MemorySink> dbg(tp::Options().dump_path(tmp.path()).overflow_nums(-1));
    run_forward_model(dbg, model, 3);
    for (int s = 0; s < 3; ++s) {
      CAPTURE(s);
      CHECK(dbg.sink().step(s).dump["data"].size() == 3);
      CHECK(dbg.sink().step(s).json_file("overflow_summary.json")["step"] == s);
    }
    CHECK(dbg.task().overflowing_calls_kept() == 9);
  }
}

TEST_CASE("a run without overflow writes no entries, no tensor files and no summary") {
  tptest::TempDir tmp;
  torch::manual_seed(0);
  torch::nn::Linear fc(8, 4);
  Overflow<tp::Level::Mix> dbg(tp::Options().dump_path(tmp.path()));
  for (int s = 0; s < 2; ++s) {
    {
      tp::ScopedDump scope(dbg, fc);
      torch::relu(fc(torch::randn({2, 8}))).sum().backward();
    }
    dbg.step();
  }
  dbg.wait_written();
  for (int s = 0; s < 2; ++s) {
    const std::string dir = rank_dir(tmp.path(), s);
    const Json dump = tptest::read_json(dir + "/dump.json");
    CHECK(dump["data"] == Json::object());
    CHECK(dump["task"] == "overflow_check");
    CHECK(files_in(dir + "/dump_tensor_data").empty());
    CHECK(!fs::exists(dir + "/overflow_summary.json"));
    CHECK(tptest::read_text(dir + "/construct.json") == "{}");
  }
}

TEST_CASE("mix: the origin's module parent, the module around it, and the backward it poisons") {
  auto net = std::make_shared<ExpNetImpl>();
  tptest::TempDir tmp;
  Overflow<tp::Level::Mix, tp::MemorySink> dbg(tp::Options().dump_path(tmp.path()).overflow_nums(-1));
  {
    tp::ScopedDump scope(dbg, net);
    net->forward(torch::ones({1, 4})).backward();
  }
  const auto& files = dbg.sink().step(0);
  const Json summary = files.json_file("overflow_summary.json");
  CHECK(summary["origin"] == "Aten.exp.0.forward");
  CHECK(summary["origin_parent"] == "Module.block.ExpBlock.forward.0");
  std::map<std::string, std::string> role;
  for (const Json& c : summary["calls"]) role[c["name"].get<std::string>()] = c["role"].get<std::string>();
  CHECK(role.count("Module.block.fc.Linear.forward.0") == 0);  // finite: not written
  CHECK(role.count("Aten.addmm.0.forward") == 0);
  CHECK(role["Module.block.ExpBlock.forward.0"] == "encloses_origin");
  CHECK(role["Aten.sum.0.forward"] == "propagated");
  CHECK(role["Aten.exp.0.backward"] == "propagated");  // its gradient is 1 * exp(120): the forward's inf
  CHECK(role["Aten.addmm.0.backward"] == "propagated");
  CHECK(role["Module.block.fc.Linear.parameters_grad.0"] == "propagated");
  std::size_t origins = 0;
  for (const auto& kv : role) origins += kv.second == "origin" || kv.second == "new_origin";
  CHECK(origins == 1);
  CHECK(files.construct["Aten.exp.0.forward"] == "Module.block.ExpBlock.forward.0");
  // Every written tensor names its file.
  for (auto it = files.dump["data"].begin(); it != files.dump["data"].end(); ++it) {
    CAPTURE(it.key());
    const std::string text = it.value().dump();
    CHECK(text.find("\"data_name\":\"" + it.key() + ".") != std::string::npos);
  }
}

TEST_CASE("a weight that already holds inf (a bad optimizer step) is propagated, not an origin: no call made it") {
  torch::manual_seed(3);
  tptest::Net net;
  {
    torch::NoGradGuard no_grad;
    net->fc->weight[1][2] = std::numeric_limits<float>::infinity();
  }
  tptest::TempDir tmp;
  Overflow<tp::Level::Mix, tp::MemorySink> dbg(tp::Options().dump_path(tmp.path()).overflow_nums(-1));
  {
    tp::ScopedDump scope(dbg, net);
    (void)net->forward(torch::ones({2, 8}));  // finite input; fc's output is inf in column 1
  }
  const auto& files = dbg.sink().step(0);
  const Json summary = files.json_file("overflow_summary.json");
  CHECK(summary["origin"].is_null());
  std::map<std::string, std::string> role;
  for (const Json& c : summary["calls"]) role[c["name"].get<std::string>()] = c["role"].get<std::string>();
  CHECK(role["Module.fc.Linear.forward.0"] == "propagated");  // its parameter brought the inf in
  CHECK(role.size() >= 2);                                    // and the ATen calls after it
  for (const auto& kv : role) CHECK_MESSAGE(kv.second == "propagated", kv.first << ": " << kv.second);
}

TEST_CASE("device path (forced on CPU): decisions wait for one batched read at flush and match the CPU path") {
  auto dump_of = [](bool device, std::int64_t nums) {
    ForwardOverflow model;
    tptest::TempDir tmp;
    auto dbg = std::make_unique<Overflow<tp::Level::L1, tp::MemorySink>>(
        tp::Options().dump_path(tmp.path()).overflow_nums(nums));
    dbg->task().force_device_path(device);
    {
      tp::ScopedDump scope(*dbg, model);
      model->forward(torch::ones({2, 8})).backward();
      if (device) CHECK(dbg->sink().steps().empty());  // nothing decided before the flush
    }
    dbg->step();
    return std::make_pair(dbg->sink().step(0).dump, dbg->sink().step(0).json_file("overflow_summary.json"));
  };
  const auto cpu = dump_of(false, -1);
  const auto device = dump_of(true, -1);
  REQUIRE(keys_of(device.first["data"]) == keys_of(cpu.first["data"]));
  for (auto it = cpu.first["data"].begin(); it != cpu.first["data"].end(); ++it) {
    CAPTURE(it.key());
    const Json& a = it.value()["output"][0];
    const Json& b = device.first["data"][it.key()]["output"][0];
    CHECK(a["Max"] == b["Max"]);
    CHECK(a["Min"] == b["Min"]);
    CHECK(a["data_name"] == b["data_name"]);
  }
  CHECK(device.second["origin"] == "Aten.mul.0.forward");
  // overflow_nums applies at that batch point, in dump order.
  const auto limited = dump_of(true, 2);
  CHECK(keys_of(limited.first["data"]) == std::vector<std::string>{"Aten.mul.0.forward", "Aten.add.0.forward"});
  CHECK(limited.second["limit_reached"] == true);
}

TEST_CASE(
    "device path: after many undecided calls the batch is read before the flush, and overflow_nums ends the dump "
    "there") {
  tptest::TempDir tmp;
  Overflow<tp::Level::L1> dbg(tp::Options().dump_path(tmp.path()));
  dbg.task().force_device_path(true);
  const std::string dir = rank_dir(tmp.path());
  std::string said = stderr_of([&] {
    tp::ScopedDump scope(dbg);
    torch::Tensor big = torch::full({4}, 60000.0, torch::kHalf);
    torch::Tensor ov = big * 2;  // the overflow, undecided for now
    torch::Tensor acc = torch::zeros({4});
    for (std::size_t k = 0; k < tp::OverflowCheckTask::kHeldEntriesBeforeDecision + 10; ++k) acc = acc + 1;
    // The batch was read inside the loop: the overflow is written and the capture has stopped.
    CHECK(fs::exists(dir + "/dump.json"));
    CHECK(dbg.task().ended());
  });
  const Json dump = read_python_json(dir + "/dump.json");
  CHECK(keys_of(dump["data"]) == std::vector<std::string>{"Aten.mul.0.forward"});
  CHECK(files_in(dir + "/dump_tensor_data") ==
        std::vector<std::string>{"Aten.mul.0.forward.input.0.pt", "Aten.mul.0.forward.output.0.pt"});
}

TEST_CASE("an in-place op's input file holds the value before the op overwrote it") {
  tptest::TempDir tmp;
  Overflow<tp::Level::L1> files(tp::Options().dump_path(tmp.path()).overflow_nums(-1));
  {
    tp::ScopedDump scope(files);
    torch::Tensor t = torch::full({3}, 40000.0, torch::kHalf);
    t.mul_(2);
  }
  const std::string dir = rank_dir(tmp.path());
  int rc = 0;
  const std::string out = tptest::run_python(
      "import torch\n"
      "d = '" +
          dir +
          "/dump_tensor_data/'\n"
          "print(torch.load(d + 'Aten.mul_.0.forward.input.0.pt').tolist(), torch.load(d + "
          "'Aten.mul_.0.forward.output.0.pt').tolist())\n",
      &rc);
  CHECK_MESSAGE(rc == 0, out);
  CHECK(out == "[40000.0, 40000.0, 40000.0] [inf, inf, inf]\n");
}

TEST_CASE("the format matches classic msprobe's overflow_check dump of the same program (Torch.mul is our Aten.mul)") {
  // msprobe's program: full((4,), 60000.0, float16) then torch.mul(big, 2), overflow_nums 1.
  tptest::TempDir tmp;
  tp::PrecisionDebugger dbg(
      tp::Options().set("task", "overflow_check").set("level", "L1").dump_path(tmp.path()).overflow_nums(1));
  {
    tp::ScopedDump scope(dbg);
    const torch::Tensor big = torch::full({4}, 60000.0, torch::kHalf);
    (void)torch::mul(big, 2);
  }
  const Json ours = read_python_json(rank_dir(tmp.path()) + "/dump.json");
  // A copy of reference-dumps/classic/overflow_L1 (msprobe 8.3.3).
  const std::string ref_dir =
      std::string(TORCHPROBE_TESTS_DIR) + "/data/reference-dumps/classic/overflow_L1/step0/rank";
  const Json ref = read_python_json(ref_dir + "/dump.json");
  CHECK(keys_of(ours) == keys_of(ref));
  CHECK(ours["task"] == ref["task"]);
  CHECK(ours["level"] == ref["level"]);
  CHECK(ours["framework"] == ref["framework"]);
  REQUIRE(keys_of(ours["data"]) == std::vector<std::string>{"Aten.mul.0.forward"});
  const Json& a = ours["data"]["Aten.mul.0.forward"];
  const Json& b = ref["data"]["Torch.mul.0.forward"];
  // Classic msprobe adds "is_recompute"; the current msprobe line (and TorchProbe) does not.
  CHECK(keys_of(a) == std::vector<std::string>{"input_args", "input_kwargs", "output"});
  CHECK(a["input_args"][1] == b["input_args"][1]);
  CHECK(a["input_kwargs"] == b["input_kwargs"]);
  for (const char* side : {"input_args", "output"}) {
    CAPTURE(side);
    const Json& x = a[side][0];
    const Json& y = b[side][0];
    CHECK(keys_of(x) == keys_of(y));
    for (const char* k : {"type", "dtype", "shape", "Max", "Min", "requires_grad"}) CHECK(x[k] == y[k]);
    CHECK(x["data_name"] == "Aten" + y["data_name"].get<std::string>().substr(5));
  }
  // msprobe's fp16 Mean/Norm of 4 x 60000 overflow in fp16; ours are exact (and do not count).
  CHECK(b["input_args"][0]["Mean"] == "Infinity");
  CHECK(a["input_args"][0]["Mean"] == 60000.0);
  CHECK(a["input_args"][0]["Norm"] == 120000.0);
  std::vector<std::string> theirs = files_in(ref_dir + "/dump_tensor_data");
  for (std::string& f : theirs) f = "Aten" + f.substr(5);
  CHECK(files_in(rank_dir(tmp.path()) + "/dump_tensor_data") == theirs);
  // The saved tensors are equal, file for file.
  int rc = 0;
  const std::string out = tptest::run_python(
      "import torch\n"
      "ours, theirs = '" +
          rank_dir(tmp.path()) + "/dump_tensor_data/Aten', '" + ref_dir +
          "/dump_tensor_data/Torch'\n"
          "for f in ('.mul.0.forward.input.0.pt', '.mul.0.forward.output.0.pt'):\n"
          "    a, b = torch.load(ours + f), torch.load(theirs + f)\n"
          "    print(a.dtype == b.dtype, a.shape == b.shape, torch.equal(a, b))\n",
      &rc);
  CHECK_MESSAGE(rc == 0, out);
  CHECK(out == "True True True\nTrue True True\n");
}
