// End to end: files on disk in msprobe's layout and format, read back by python3, compared with
// msprobe's own dump of the same model; filters, config handling and failure behaviour.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using L1Stats = tp::Debugger<tp::Level::L1, tp::Task::Statistics>;

namespace {

using tptest::Net;

// The program of msprobe's reference dumps: seed 1234, two steps of x = randn(2, 8), relu(fc(x)).sum().backward().
template <class D>
void run_reference_program(D& dbg, int steps = 2) {
  torch::manual_seed(1234);
  Net net;
  for (int s = 0; s < steps; ++s) {
    const auto x = torch::randn({2, 8}, torch::requires_grad());
    {
      tp::ScopedDump scope(dbg, net);
      net->forward(x).sum().backward();
    }
    dbg.step();
  }
  dbg.wait_written();  // the steps are written by the writer's thread
}

std::string only_subdir(const std::string& dir) {
  std::vector<std::string> subs;
  for (const auto& e : fs::directory_iterator(dir)) subs.push_back(e.path().string());
  REQUIRE(subs.size() == 1);
  return subs[0];
}

std::string proc_dir() { return "proc" + std::to_string(::getpid()); }

// Forward tensors: Max/Min exactly as msprobe's, Mean/Norm within 1e-6.
void check_same_statistics(const Json& ours, const Json& theirs) {
  tptest::check_same_statistics(ours, theirs, /*extrema_rel=*/0.0);
}

}  // namespace

TEST_CASE("the quick-start model's statistics equal those msprobe's Python dump wrote for the same tensors") {
  tptest::TempDir tmp;
  L1Stats dbg(tp::Options().dump_path(tmp.path()));
  run_reference_program(dbg);
  for (int s = 0; s < 2; ++s) {
    CAPTURE(s);
    const std::string step = "/step" + std::to_string(s);
    const Json ours = tptest::read_json(tmp.path() + step + "/" + proc_dir() + "/dump.json")["data"];
    const Json ref = tptest::read_json(
        only_subdir(std::string(TORCHPROBE_TESTS_DIR) + "/data/reference-dumps/stat_L1" + step) + "/dump.json")["data"];
    const Json& linear = ref["Functional.linear.0.forward"];
    const Json &x = linear["input_args"][0], &w = linear["input_args"][1], &b = linear["input_args"][2],
               &y = linear["output"][0];
    const Json& relu = ref["Functional.relu.0.forward"]["output"][0];
    const Json& sum = ref["Tensor.sum.0.forward"]["output"][0];

    check_same_statistics(ours["Aten.t.0.forward"]["input_args"][0], w);
    const Json& addmm = ours["Aten.addmm.0.forward"];
    check_same_statistics(addmm["input_args"][0], b);
    check_same_statistics(addmm["input_args"][1], x);
    CHECK(addmm["input_args"][2]["shape"] == Json::parse("[8, 4]"));  // the transposed weight
    CHECK(addmm["input_args"][2]["Max"] == w["Max"]);
    CHECK(addmm["input_kwargs"] ==
          Json::parse(R"({"beta": {"type": "int", "value": 1}, "alpha": {"type": "int", "value": 1}})"));
    check_same_statistics(addmm["output"][0], y);
    check_same_statistics(ours["Aten.relu.0.forward"]["input_args"][0], y);
    check_same_statistics(ours["Aten.relu.0.forward"]["output"][0], relu);
    check_same_statistics(ours["Aten.sum.0.forward"]["input_args"][0], relu);
    check_same_statistics(ours["Aten.sum.0.forward"]["output"][0], sum);
  }
}

TEST_CASE(
    "the step directories hold dump.json, stack.json and construct.json that python's json reads in msprobe's key "
    "order") {
  tptest::TempDir tmp;
  L1Stats dbg(tp::Options().dump_path(tmp.path()));
  run_reference_program(dbg);
  const std::string dir0 = tmp.path() + "/step0/" + proc_dir();
  const std::string dir1 = tmp.path() + "/step1/" + proc_dir();
  for (const std::string f : {"dump.json", "stack.json", "construct.json"}) {
    CHECK(fs::exists(dir0 + "/" + f));
    CHECK(fs::exists(dir1 + "/" + f));
  }
  CHECK(tptest::read_text(dir0 + "/construct.json") == "{}");
  int rc = 0;
  const std::string out = tptest::run_python(
      "import json\n"
      "d = json.load(open('" +
          dir0 +
          "/dump.json'))\n"
          "print(list(d.keys()))\n"
          "print(list(d['data'].keys()))\n"
          "print(list(d['data']['Aten.addmm.0.forward'].keys()))\n"
          "print(list(d['data']['Aten.addmm.0.forward']['output'][0].keys()))\n"
          "s = json.load(open('" +
          dir0 +
          "/stack.json'))\n"
          "print(sorted(n for g in s.values() for n in g[0]))\n"
          "print(all(isinstance(f, str) and f.startswith('File ') for g in s.values() for f in g[1]))\n"
          "print(open('" +
          dir0 + "/dump.json').read() == json.dumps(d, indent=1))\n",
      &rc);
  REQUIRE(rc == 0);
  CHECK(out ==
        "['task', 'level', 'framework', 'dump_data_dir', 'data']\n"
        "['Aten.t.0.forward', 'Aten.addmm.0.forward', 'Aten.relu.0.forward', 'Aten.sum.0.forward', "
        "'Aten.sum.0.backward', 'Aten.relu.0.backward', 'Aten.addmm.0.backward', 'Aten.t.0.backward']\n"
        "['input_args', 'input_kwargs', 'output']\n"
        "['type', 'dtype', 'shape', 'Max', 'Min', 'Mean', 'Norm', 'requires_grad']\n"
        "['Aten.addmm.0.forward', 'Aten.relu.0.forward', 'Aten.sum.0.forward', 'Aten.t.0.forward']\n"
        "True\n"
        "True\n");
  const Json stack = tptest::read_json(dir0 + "/stack.json");
  bool names_the_caller = false;  // the user's forward() is among the frames of its ops
  bool shows_library_internals = false;
  for (const auto& g : stack.items())
    for (const auto& f : g.value()[1]) {
      names_the_caller |= f.get<std::string>().find("NetImpl::forward") != std::string::npos;
      shows_library_internals |= f.get<std::string>().find("libtorch") != std::string::npos;
    }
  CHECK(names_the_caller);
  CHECK_FALSE(shows_library_internals);
}

TEST_CASE("NaN and infinities are written as Python's json writes them") {
  tptest::TempDir tmp;
  L1Stats dbg(tp::Options().dump_path(tmp.path()).extra_info(false));
  dbg.start();
  torch::tensor({1.0f, NAN}).neg();
  torch::tensor({INFINITY, -INFINITY}).abs();
  dbg.stop();
  dbg.wait_written();
  const std::string file = tmp.path() + "/step0/" + proc_dir() + "/dump.json";
  const std::string text = tptest::read_text(file);
  CHECK(text.find("\"Max\": NaN") != std::string::npos);
  CHECK(text.find("\"Min\": -Infinity") != std::string::npos);
  CHECK(text.find("\"Max\": Infinity") != std::string::npos);
  int rc = 0;
  const std::string out =
      tptest::run_python("import json, math\nd = json.load(open('" + file +
                             "'))['data']\nprint(math.isnan(d['Aten.neg.0.forward']['output'][0]['Mean']), "
                             "d['Aten.abs.0.forward']['output'][0]['Min'])\n",
                         &rc);
  CHECK(rc == 0);
  CHECK(out == "True inf\n");
  CHECK_FALSE(fs::exists(tmp.path() + "/step0/" + proc_dir() + "/stack.json"));  // extra_info false
}

TEST_CASE("the step filter dumps only the listed steps and stops for good after the last") {
  tptest::TempDir tmp;
  L1Stats dbg(tp::Options().dump_path(tmp.path()).step({1, "3-4"}));
  torch::manual_seed(0);
  Net net;
  for (int s = 0; s < 6; ++s) {
    {
      tp::ScopedDump scope(dbg, net);
      net->forward(torch::randn({1, 8}));
    }
    dbg.step();
  }
  dbg.wait_written();
  CHECK_FALSE(fs::exists(tmp.path() + "/step0"));
  CHECK(fs::exists(tmp.path() + "/step1/" + proc_dir() + "/dump.json"));
  CHECK_FALSE(fs::exists(tmp.path() + "/step2"));
  CHECK(fs::exists(tmp.path() + "/step3"));
  CHECK(fs::exists(tmp.path() + "/step4"));
  CHECK_FALSE(fs::exists(tmp.path() + "/step5"));
  CHECK_FALSE(dbg.running());
}

TEST_CASE("set_init_step numbers the steps from the given value") {
  tptest::TempDir tmp;
  L1Stats dbg(tp::Options().dump_path(tmp.path()));
  dbg.set_init_step(10);
  run_reference_program(dbg, 2);
  CHECK(fs::exists(tmp.path() + "/step10"));
  CHECK(fs::exists(tmp.path() + "/step11"));
  // Called again after steps were taken, it restarts the count there (msprobe resets its loop).
  dbg.set_init_step(100);
  run_reference_program(dbg, 1);
  CHECK(fs::exists(tmp.path() + "/step100"));
  CHECK_FALSE(fs::exists(tmp.path() + "/step102"));
  CHECK_FALSE(fs::exists(tmp.path() + "/step12"));
  CHECK_THROWS_AS(dbg.set_init_step(-1), std::invalid_argument);
}

TEST_CASE("the rank directory comes from start's rank_id, else $RANK, else proc{pid}; the rank filter accepts ranges") {
  tptest::TempDir tmp;
  L1Stats dbg(tp::Options().dump_path(tmp.path()).rank({"4-6"}));
  torch::manual_seed(0);
  Net net;
  dbg.start(net, 5);
  net->forward(torch::randn({1, 8}));
  dbg.stop();
  dbg.wait_written();
  CHECK(fs::exists(tmp.path() + "/step0/rank5/dump.json"));
  dbg.step();
  dbg.start(net, 7);  // not in 4-6: nothing happens
  CHECK_FALSE(dbg.running());
  dbg.step();
  ::setenv("RANK", "6", 1);
  dbg.start(net);
  ::unsetenv("RANK");
  net->forward(torch::randn({1, 8}));
  dbg.stop();
  dbg.wait_written();
  CHECK(fs::exists(tmp.path() + "/step2/rank6/dump.json"));
  CHECK_FALSE(fs::exists(tmp.path() + "/step1"));
}

TEST_CASE("scope, list and data_mode select what is written") {
  auto names_with = [](tp::Options opts) {
    tptest::TempDir tmp;
    L1Stats dbg(opts.dump_path(tmp.path()).extra_info(false));
    run_reference_program(dbg, 1);
    const Json d = tptest::read_json(tmp.path() + "/step0/" + proc_dir() + "/dump.json")["data"];
    std::vector<std::string> out;
    for (const auto& kv : d.items()) {
      std::string keys;
      for (const auto& k : kv.value().items()) keys += k.key() + ",";
      out.push_back(kv.key() + ":" + keys);
    }
    return out;
  };
  CHECK(names_with(tp::Options().scope({"Aten.addmm.0.forward", "Aten.relu.0.forward"})) ==
        std::vector<std::string>{"Aten.addmm.0.forward:input_args,input_kwargs,output,",
                                 "Aten.relu.0.forward:input_args,input_kwargs,output,"});
  CHECK(names_with(tp::Options().list({"relu", "Aten.t.0"})) ==
        std::vector<std::string>{"Aten.t.0.forward:input_args,input_kwargs,output,",
                                 "Aten.relu.0.forward:input_args,input_kwargs,output,",
                                 "Aten.relu.0.backward:input,output,", "Aten.t.0.backward:input,output,"});
  CHECK(names_with(tp::Options().data_mode({"forward", "output"}).list({"sum"})) ==
        std::vector<std::string>{"Aten.sum.0.forward:output,"});
  CHECK(names_with(tp::Options().data_mode({"input"}).list({"sum"})) ==
        std::vector<std::string>{"Aten.sum.0.forward:input_args,input_kwargs,", "Aten.sum.0.backward:input,"});
  CHECK(names_with(tp::Options().data_mode({"backward"})) ==
        std::vector<std::string>{"Aten.sum.0.backward:input,output,", "Aten.relu.0.backward:input,output,",
                                 "Aten.addmm.0.backward:input,output,", "Aten.t.0.backward:input,output,"});
  CHECK(names_with(tp::Options().risk_level("CORE")) ==
        std::vector<std::string>{"Aten.addmm.0.forward:input_args,input_kwargs,output,",
                                 "Aten.addmm.0.backward:input,output,"});
}

TEST_CASE("summary_mode md5 adds the CRC-32 that python's zlib computes; xor replaces the statistics") {
  tptest::TempDir tmp;
  {
    L1Stats dbg(tp::Options().dump_path(tmp / "md5").summary_mode("md5").extra_info(false));
    dbg.start();
    torch::arange(6, at::kFloat).reshape({2, 3}).t().neg();
    dbg.stop();
  }
  const Json md5 =
      tptest::read_json(tmp / "md5/step0/" + proc_dir() + "/dump.json")["data"]["Aten.neg.0.forward"]["output"][0];
  int rc = 0;
  const std::string want = tptest::run_python(
      "import torch, zlib\nt = -torch.arange(6, dtype=torch.float32).reshape(2, 3).t()\n"
      "print('%08x' % zlib.crc32(t.contiguous().numpy().tobytes()))\n",
      &rc);
  REQUIRE(rc == 0);
  CHECK(md5["md5"].get<std::string>() + "\n" == want);
  CHECK(md5.contains("Max"));
  {
    L1Stats dbg(tp::Options().dump_path(tmp / "xor").summary_mode("xor").extra_info(false));
    dbg.start();
    torch::ones({3}).neg().sum();
    dbg.stop();
  }
  const Json x = tptest::read_json(tmp / "xor/step0/" + proc_dir() + "/dump.json")["data"];
  std::vector<std::string> keys;
  for (const auto& kv : x["Aten.neg.0.forward"]["output"][0].items()) keys.push_back(kv.key());
  CHECK(keys == std::vector<std::string>{"type", "dtype", "shape", "md5", "requires_grad"});
  CHECK(x["Aten.neg.0.forward"]["output"][0]["md5"].get<std::string>().rfind("0x", 0) == 0);
  CHECK(x["Aten.sum.0.forward"]["output"][0]["md5"] == -3.0);  // 0-d: the value instead of a checksum
}

TEST_CASE("md5 of a large tensor is computed off the training thread, from the values the call saw") {
  tptest::TempDir tmp;
  std::uint64_t offloaded = 0;
  {
    L1Stats dbg(tp::Options().dump_path(tmp.path()).summary_mode("md5").extra_info(false));
    dbg.start();
    // 2 MiB of float32 (above the worker's 1 MiB threshold), then overwritten in place at once:
    // the checksum must be of the values neg() returned, not of what the memory holds later.
    at::Tensor y = torch::arange(1 << 19, at::kFloat).neg();
    y.mul_(3);
    torch::arange(4, at::kFloat).neg();  // small: hashed at once
    dbg.stop();
    offloaded = dbg.task().checksums_offloaded();
  }
  CHECK(offloaded >= 1);
  const Json data = tptest::read_json(tmp / ("step0/" + proc_dir() + "/dump.json"))["data"];
  int rc = 0;
  const std::string want = tptest::run_python(
      "import torch, zlib\n"
      "print('%08x' % zlib.crc32((-torch.arange(1 << 19, dtype=torch.float32)).numpy().tobytes()))\n"
      "print('%08x' % zlib.crc32((-torch.arange(1 << 19, dtype=torch.float32) * 3).numpy().tobytes()))\n"
      "print('%08x' % zlib.crc32((-torch.arange(4, dtype=torch.float32)).numpy().tobytes()))\n",
      &rc);
  REQUIRE(rc == 0);
  CHECK(data["Aten.neg.0.forward"]["output"][0]["md5"].get<std::string>() + "\n" == want.substr(0, 9));
  CHECK(data["Aten.mul_.0.forward"]["output"][0]["md5"].get<std::string>() + "\n" == want.substr(9, 9));
  CHECK(data["Aten.neg.1.forward"]["output"][0]["md5"].get<std::string>() + "\n" == want.substr(18, 9));
  // The item keeps msprobe's key order, with md5 last.
  std::vector<std::string> keys;
  for (const auto& kv : data["Aten.neg.0.forward"]["output"][0].items()) keys.push_back(kv.key());
  CHECK(keys ==
        std::vector<std::string>{"type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "requires_grad", "md5"});
}

TEST_CASE(
    "md5 on the device path copies the tensor where it lives and hashes it at flush, with the values the call saw") {
  tptest::TempDir tmp;
  Json forced, direct;
  for (bool force : {true, false}) {
    const std::string path = tmp / (force ? "forced" : "direct");
    L1Stats dbg(tp::Options().dump_path(path).summary_mode("md5").extra_info(false));
    dbg.task().force_device_path(force);  // CPU tensors take the device path (no GPU in CI)
    dbg.start();
    at::Tensor y = torch::arange(24, at::kFloat).reshape({4, 6}).t().neg();  // strided, small
    y.mul_(2);
    dbg.stop();
    dbg.wait_written();
    (force ? forced : direct) = tptest::read_json(path + "/step0/" + proc_dir() + "/dump.json")["data"];
  }
  int rc = 0;
  const std::string want = tptest::run_python(
      "import torch, zlib\n"
      "y = -torch.arange(24, dtype=torch.float32).reshape(4, 6).t()\n"
      "print('%08x' % zlib.crc32(y.contiguous().numpy().tobytes()))\n"
      "print('%08x' % zlib.crc32((y * 2).contiguous().numpy().tobytes()))\n",
      &rc);
  REQUIRE(rc == 0);
  CHECK(forced["Aten.neg.0.forward"]["output"][0]["md5"].get<std::string>() + "\n" == want.substr(0, 9));
  CHECK(forced["Aten.mul_.0.forward"]["output"][0]["md5"].get<std::string>() + "\n" == want.substr(9, 9));
  // The same checksums and key order as the host path.
  for (const char* entry : {"Aten.neg.0.forward", "Aten.mul_.0.forward"}) {
    CAPTURE(entry);
    const Json& a = forced[entry]["output"][0];
    const Json& b = direct[entry]["output"][0];
    CHECK(a["md5"] == b["md5"]);
    std::vector<std::string> ka, kb;
    for (const auto& kv : a.items()) ka.push_back(kv.key());
    for (const auto& kv : b.items()) kb.push_back(kv.key());
    CHECK(ka == kb);
  }
}

TEST_CASE("an exception thrown inside the scope still stops the dump and leaves valid files") {
  tptest::TempDir tmp;
  L1Stats dbg(tp::Options().dump_path(tmp.path()));
  torch::manual_seed(0);
  Net net;
  try {
    tp::ScopedDump scope(dbg, net);
    net->forward(torch::randn({1, 8}));
    throw std::runtime_error("training failed");
  } catch (const std::runtime_error&) {
  }
  dbg.wait_written();
  CHECK_FALSE(dbg.running());
  CHECK_FALSE(at::hasCallbacks());
  int rc = 0;
  const std::string out = tptest::run_python(
      "import json\nprint(len(json.load(open('" + tmp.path() + "/step0/" + proc_dir() + "/dump.json'))['data']))\n",
      &rc);
  CHECK(rc == 0);
  CHECK(out == "4\n");  // randn, t, addmm, relu
}

TEST_CASE("a config.json drives both Debugger and PrecisionDebugger; Options override the file") {
  tptest::TempDir tmp;
  const std::string cfg = tmp / "config.json";
  std::ofstream(cfg) << R"({"task": "statistics", "dump_path": ")" << tmp / "from_file"
                     << R"(", "level": "L1", "step": [],
                           "statistics": {"scope": [], "list": ["relu"], "data_mode": ["all"], "summary_mode": "statistics"}})";
  {
    tp::PrecisionDebugger dbg(cfg);
    CHECK(dbg.config().level == tp::Level::L1);
    run_reference_program(dbg, 1);
  }
  const Json d = tptest::read_json(tmp / "from_file/step0/" + proc_dir() + "/dump.json")["data"];
  CHECK(d.size() == 2);
  CHECK(d.contains("Aten.relu.0.forward"));
  CHECK(d.contains("Aten.relu.0.backward"));
  {
    L1Stats dbg(tp::Options().config_file(cfg).dump_path(tmp / "overridden").list({"sum"}));
    run_reference_program(dbg, 1);
  }
  const Json o = tptest::read_json(tmp / "overridden/step0/" + proc_dir() + "/dump.json")["data"];
  CHECK(o.size() == 2);
  CHECK(o.contains("Aten.sum.0.forward"));
  CHECK(o.contains("Aten.sum.0.backward"));
}

TEST_CASE("a level and task pair that is not implemented yet is refused with the keys and what is available") {
  tptest::TempDir tmp;
  const std::string cfg = tmp / "config.json";
  std::ofstream(cfg) << R"({"task": "free_benchmark", "dump_path": ")" << tmp.path() << R"(", "level": "L0"})";
  CHECK_THROWS_WITH_AS(tp::PrecisionDebugger{cfg}, doctest::Contains("\"free_benchmark\" is not available"),
                       tp::ConfigError);
}

TEST_CASE("bad config values are rejected when the Debugger is built, naming the key") {
  CHECK_THROWS_WITH_AS(L1Stats(tp::Options().dump_path("/tmp/x").step({"6-4"})), doctest::Contains("step"),
                       tp::ConfigError);
  CHECK_THROWS_WITH_AS(L1Stats(tp::Options().dump_path("/tmp/x").data_mode({"all", "input"})),
                       doctest::Contains("data_mode"), tp::ConfigError);
  CHECK_THROWS_WITH_AS(L1Stats(tp::Options().dump_path("/tmp/x").scope({"Aten.t.0.forward"})),
                       doctest::Contains("scope"), tp::ConfigError);
  CHECK_THROWS_WITH_AS(L1Stats("/nonexistent/config.json"), doctest::Contains("/nonexistent/config.json"),
                       tp::ConfigError);
}

TEST_CASE("an unwritable dump_path is reported at start() with the path and the OS error") {
  tptest::TempDir tmp;
  const std::string locked = tmp / "locked";
  fs::create_directory(locked);
  ::chmod(locked.c_str(), 0500);
  if (::geteuid() == 0) {
    // root ignores permission bits; a path below a regular file fails for everyone
    std::ofstream(locked + "/file") << "x";
  }
  const std::string target = ::geteuid() == 0 ? locked + "/file/dump" : locked + "/dump";
  L1Stats dbg(tp::Options().dump_path(target));
  CHECK_THROWS_WITH(dbg.start(), doctest::Contains(target.c_str()));
  CHECK_FALSE(dbg.running());
  CHECK_FALSE(at::hasCallbacks());
  ::chmod(locked.c_str(), 0700);
}

namespace {

// A sink of the user's own that needs an argument to be made: a callback, handed each step's
// entry names when the step is flushed (on the thread that calls stop()/step(): it has no
// writes_in_background).
class CallbackSink {
 public:
  using Callback = std::function<void(std::int64_t step, std::vector<std::string> names)>;
  explicit CallbackSink(Callback on_step) : on_step_(std::move(on_step)) {}
  void open(const std::string&) {}
  void write_step(const tp::StepDump& d) {
    std::vector<std::string> names;
    for (const tp::Record* r : d.by_first_place(tp::StepDump::in_dump)) names.push_back(r->name);
    on_step_(d.step, std::move(names));
  }

 private:
  Callback on_step_;
};

}  // namespace

TEST_CASE("a sink made with a constructor argument is moved into the Debugger and gets every step's entries") {
  std::map<std::int64_t, std::vector<std::string>> seen;  // the last flush of each step
  tptest::TempDir tmp;
  tp::Debugger<tp::Level::L1, tp::Task::Statistics, CallbackSink> dbg(
      tp::Options().dump_path(tmp.path()),
      CallbackSink([&](std::int64_t step, std::vector<std::string> names) { seen[step] = std::move(names); }));
  run_reference_program(dbg);

  // The reference: the same program into a MemorySink, whose dump.json lists the same entries.
  tptest::TempDir tmp2;
  tp::Debugger<tp::Level::L1, tp::Task::Statistics, tp::MemorySink> mem(tp::Options().dump_path(tmp2.path()));
  run_reference_program(mem);
  REQUIRE(seen.size() == 2);
  for (std::int64_t step : {0, 1}) {
    CAPTURE(step);
    std::vector<std::string> want;
    for (auto it = mem.sink().step(step).dump["data"].begin(); it != mem.sink().step(step).dump["data"].end(); ++it)
      want.push_back(it.key());
    CHECK(want.size() > 3);
    CHECK(seen.at(step) == want);
  }
}

namespace {

// msprobe's guide: "if stop is placed before the backward code, step must come after it to collect
// the forward and backward data between start and stop". `stop_first`: start, forward, stop,
// backward, step; otherwise start, forward, backward, stop, step. Returns step 0's dump.json.
template <tp::Level L, class Model = Net>
Json dump_of_loop(const std::string& dir, bool stop_first) {
  torch::manual_seed(5);
  Model net;
  const auto x = torch::randn({3, 8});
  {
    tp::Debugger<L, tp::Task::Statistics> dbg(tp::Options().dump_path(dir).extra_info(false));
    dbg.start(net);
    auto loss = net->forward(x).sum();
    if (stop_first) dbg.stop();
    loss.backward();
    dbg.stop();
    dbg.step();
    dbg.wait_written();
  }
  return tptest::read_json(dir + "/step0/proc" + std::to_string(::getpid()) + "/dump.json");
}

template <tp::Level L, class Model = Net>
void check_stop_before_backward(const std::string& level) {
  CAPTURE(level);
  tptest::TempDir tmp;
  const Json stopped_first = dump_of_loop<L, Model>(tmp / "stop_first", true);
  const Json stopped_last = dump_of_loop<L, Model>(tmp / "stop_last", false);
  std::size_t backward = 0;
  for (const auto& kv : stopped_last["data"].items())
    backward +=
        kv.key().find(".backward") != std::string::npos || kv.key().find("parameters_grad") != std::string::npos;
  CHECK(backward > 0);
  CHECK(stopped_first["data"] == stopped_last["data"]);
}

// A module with two parameters of which forward uses one, in a Sequential: at L0 its backward entry
// waits for its parameters_grad, which waits for a gradient that never comes. With stop() first,
// nothing reaches the step after stop() wrote it; step() must still write what waits.
struct HalfUsedImpl : torch::nn::Module {
  HalfUsedImpl()
      : used(register_parameter("used", torch::ones({8}))), unused(register_parameter("unused", torch::ones({8}))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x * used; }
  torch::Tensor used, unused;
};
TORCH_MODULE(HalfUsed);
struct HalfUsedNet : torch::nn::Sequential {
  HalfUsedNet() : torch::nn::Sequential(HalfUsed()) {}
};

}  // namespace

TEST_CASE(
    "stop() before backward, step() after it: the step's backward entries are still dumped, the same as with stop() "
    "after backward (msprobe's guide)") {
  check_stop_before_backward<tp::Level::L1>("L1");
  check_stop_before_backward<tp::Level::Mix>("mix");
  check_stop_before_backward<tp::Level::L0>("L0");
}

TEST_CASE("stop() before backward at L0: what still waits at step() (a parameter that got no gradient) is written") {
  tptest::TempDir tmp;
  const Json stopped_first = dump_of_loop<tp::Level::L0, HalfUsedNet>(tmp / "stop_first", true);
  const Json stopped_last = dump_of_loop<tp::Level::L0, HalfUsedNet>(tmp / "stop_last", false);
  CHECK(stopped_last["data"].contains("Module.0.HalfUsed.backward.0"));
  CHECK(stopped_last["data"]["Module.0.HalfUsed.parameters_grad.0"].contains("used"));
  CHECK(stopped_first["data"] == stopped_last["data"]);
}

TEST_CASE("a backward that runs after step() belongs to no dumped step: nothing of it is written") {
  tptest::TempDir tmp;
  torch::manual_seed(5);
  Net net;
  const auto x = torch::randn({3, 8});
  {
    L1Stats dbg(tp::Options().dump_path(tmp.path()).extra_info(false));
    dbg.start(net);
    auto loss = net->forward(x).sum();
    dbg.stop();
    dbg.step();
    loss.backward();
    dbg.wait_written();
  }
  const Json d = tptest::read_json(tmp / ("step0/proc" + std::to_string(::getpid()) + "/dump.json"));
  CHECK(d["data"].size() > 0);
  for (const auto& kv : d["data"].items()) CHECK(kv.key().find(".backward") == std::string::npos);
  CHECK_FALSE(fs::exists(tmp / "step1"));
}

TEST_CASE("a Debugger destroyed without step() writes what arrived since stop(), as step() would have") {
  tptest::TempDir tmp;
  auto run = [&](const std::string& dir, bool call_step) {
    torch::manual_seed(5);
    Net net;
    const auto x = torch::randn({3, 8});
    {
      L1Stats dbg(tp::Options().dump_path(tmp / dir).extra_info(false));
      dbg.start(net);
      auto loss = net->forward(x).sum();
      dbg.stop();
      loss.backward();  // after stop(): it belongs to this step, written at step() or by the destructor
      if (call_step) dbg.step();
    }
    return tptest::read_json(tmp / (dir + "/step0/proc" + std::to_string(::getpid()) + "/dump.json"));
  };
  const Json destroyed = run("destroyed", false), stepped = run("stepped", true);
  CHECK(destroyed["data"].contains("Aten.addmm.0.backward"));
  CHECK(destroyed["data"] == stepped["data"]);
}

TEST_CASE("a tp::Debugger is not the process's debugger: torchprobe::start/stop/step do not reach it") {
  tptest::TempDir tmp;
  Net net;
  L1Stats dbg(tp::Options().dump_path(tmp.path()));
  CHECK_THROWS_AS(tp::process_debugger(), std::logic_error);
  CHECK_THROWS_AS(tp::start(net), std::logic_error);
  CHECK_THROWS_AS(tp::stop(), std::logic_error);
  CHECK_THROWS_AS(tp::step(), std::logic_error);
  CHECK_FALSE(dbg.running());
}

TEST_CASE("precision low or high changes nothing TorchProbe writes: statistics are accumulated in double") {
  tptest::TempDir tmp;
  auto dump_with = [&](const std::string& precision) {
    torch::manual_seed(9);
    Net net;
    net->to(torch::kBFloat16);  // bf16 tensors, where a low-precision sum would show
    tp::Debugger<tp::Level::L1, tp::Task::Statistics> dbg(
        tp::Options().dump_path(tmp / precision).extra_info(false).set("precision", precision));
    dbg.start(net);
    net->forward(torch::randn({64, 8}).to(torch::kBFloat16) * 100).sum();
    dbg.stop();
    dbg.step();
    dbg.wait_written();
    return tptest::read_text(tmp / (precision + "/step0/proc" + std::to_string(::getpid()) + "/dump.json"));
  };
  const std::string low = dump_with("low");
  CHECK(low.find("Aten.addmm.0.forward") != std::string::npos);
  CHECK(low == dump_with("high"));
}

TEST_CASE("Options' task() and level() setters configure a PrecisionDebugger as set(\"task\"/\"level\") does") {
  tptest::TempDir tmp;
  tp::PrecisionDebugger by_setters(tp::Options().dump_path(tmp / "a").task("tensor").level("mix"));
  CHECK(by_setters.config().task.str() == "tensor");
  CHECK(by_setters.config().level == tp::Level::Mix);
  tp::PrecisionDebugger by_enum(tp::Options().dump_path(tmp / "b").task("overflow_check").level(tp::Level::L0));
  CHECK(by_enum.config().task.str() == "overflow_check");
  CHECK(by_enum.config().level == tp::Level::L0);
  CHECK_THROWS_WITH(tp::PrecisionDebugger(tp::Options().dump_path(tmp / "c").task("no_such_task")),
                    doctest::Contains("no_such_task"));
}
