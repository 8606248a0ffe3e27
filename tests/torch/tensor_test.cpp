// Task::Tensor and save(): .pt files that python's torch.load reads back equal, named as msprobe
// names them; the bounded writer; the step journal and crash recovery (a child process SIGKILLed at
// random points: kill_test.cpp); full-disk and unwritable-path errors; permissions.
//
// The full-disk test runs in a child process (child_process.hpp): a static object below runs the
// child's program before doctest's main.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "child_process.hpp"
#include "test_support.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

using tptest::Net;

std::string proc_dir() { return "proc" + std::to_string(::getpid()); }

std::string recover_tool() { return std::string(TORCHPROBE_TESTS_DIR) + "/../tools/recover_dump.py"; }

std::vector<std::string> names_of(const Json& data) {
  std::vector<std::string> names;
  for (const auto& kv : data.items()) names.push_back(kv.key());
  return names;
}

// Every "data_name" below `v`, in document order.
void collect_data_names(const Json& v, std::vector<std::string>& out) {
  if (v.is_object()) {
    if (v.contains("data_name")) out.push_back(v["data_name"].get<std::string>());
    for (const auto& kv : v.items()) collect_data_names(kv.value(), out);
  } else if (v.is_array()) {
    for (const auto& e : v) collect_data_names(e, out);
  }
}

std::set<std::string> files_in(const std::string& dir) {
  std::set<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

at::Tensor load_pt(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return torch::pickle_load(bytes).toTensor();
}

// ---- child processes ------------------------------------------------------------------------

// The full-disk program: files larger than 64 KiB cannot be written (RLIMIT_FSIZE; SIGXFSZ ignored
// so write() fails with EFBIG instead of the process being killed). Two steps, each with a small and
// a large op; it must run to the end.
int child_file_size_limit(const std::string& dir) {
  ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limit {
    64 * 1024, 64 * 1024
  };
  if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 3;
  tp::Debugger<tp::Level::L1, tp::Task::Tensor> dbg(tp::Options().dump_path(dir));
  for (int s = 0; s < 2; ++s) {
    dbg.start();
    torch::neg(torch::ones({16}));              // small files: written
    torch::sigmoid(torch::ones({256 * 1024}));  // 1 MiB files: EFBIG
    torch::exp(torch::zeros({4}));              // small again: still written after the failure
    dbg.stop();
    dbg.step();
  }
  return 0;
}

struct ChildProgram {
  ChildProgram() {
    const char* mode = std::getenv("TORCHPROBE_TEST_CHILD");
    if (!mode || std::string(mode) != "fsize") return;  // not a child, or another test file's
    const std::string dir = std::getenv("TORCHPROBE_TEST_DIR") ? std::getenv("TORCHPROBE_TEST_DIR") : "";
    int rc = 2;
    try {
      rc = child_file_size_limit(dir);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child failed: %s\n", e.what());
      rc = 4;
    }
    std::fflush(nullptr);
    std::_Exit(rc);
  }
} child_program;

}  // namespace

// ---- .pt files ------------------------------------------------------------------------------

TEST_CASE("a .pt file is byte for byte what torch::pickle_save writes, small or large, with or without direct I/O") {
  tptest::TempDir tmp;
  const bool direct_io = tp::io::direct_io_supported(tmp.path());
  MESSAGE("O_DIRECT in " << tmp.path() << ": "
                         << std::string(direct_io ? "accepted" : "refused (ordinary writes only)"));
  torch::manual_seed(3);
  tp::io::TensorWriter writer(std::size_t{64} << 20);
  const at::Tensor small = torch::randn({3, 5});
  const at::Tensor large = torch::randn({786433});  // 3 MiB + 4 bytes: a partial last block

  // A large snapshot in a writer's buffer lines up with its place in the file: all but its first
  // and last partial blocks go to the disk straight from memory (this pins kTensorPayloadOffset to
  // where this libtorch version puts the tensor's bytes).
  tp::io::Reservation memory = writer.reserve(large.nbytes());
  const at::Tensor snapshot = tp::snapshot_for_file(large, memory);
  // The same bytes 8 bytes off that lining: copied through the staging buffer, no page cache.
  // aligned_alloc's size must be a multiple of the alignment (ASan enforces it; glibc lets it pass).
  void* block = std::aligned_alloc(4096, (large.nbytes() + 8192 + 4095) / 4096 * 4096);
  REQUIRE(block != nullptr);
  const at::Tensor misaligned = at::from_blob(
      static_cast<char*>(block) + tp::io::kTensorPayloadOffset + 8, large.sizes(), [block](void*) { std::free(block); },
      at::TensorOptions().dtype(at::kFloat));
  misaligned.copy_(large);

  struct Case {
    const char* name;
    at::Tensor t;
    std::uint64_t direct_bytes;
  };
  const std::size_t body = (large.nbytes() - (4096 - tp::io::kTensorPayloadOffset)) / 4096 * 4096;
  for (const Case& c :
       {Case{"small", small, 0}, Case{"snapshot", snapshot, direct_io ? body : 0}, Case{"misaligned", misaligned, 0}}) {
    CAPTURE(c.name);
    const std::string path = tmp / (std::string(c.name) + ".pt");
    CHECK(tp::io::write_tensor_file(path, c.t) == c.direct_bytes);
    const std::vector<char> expected = torch::pickle_save(c.t);
    CHECK(fs::file_size(path) == expected.size());
    CHECK(tptest::read_text(path) == std::string(expected.begin(), expected.end()));
    CHECK(torch::equal(load_pt(path), c.name == std::string("small") ? small : large));
  }
}

TEST_CASE("every dtype and non-contiguous tensors load in python (torch.load, default arguments) as equal tensors") {
  tptest::TempDir tmp;
  tp::Debugger<tp::Level::Debug, tp::Task::Tensor> dbg(tp::Options().dump_path(tmp.path()));
  torch::manual_seed(5);
  const at::Tensor base = torch::randn({6, 10}) * 100;
  struct Case {
    std::string name;
    at::Tensor t;
  };
  std::vector<Case> cases;
  for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kBool, at::kByte, at::kChar,
                               at::kShort, at::kInt, at::kLong}) {
    const at::Tensor t = dtype == at::kBool ? base.gt(0) : base.to(dtype);
    const std::string name = tp::dtype_name(dtype).substr(6);
    cases.push_back({name, t});
    cases.push_back({name + "_transposed", t.t()});
    cases.push_back({name + "_strided", t.slice(1, 1, 10, 3)});
  }
  for (at::ScalarType dtype : {at::kComplexFloat, at::kComplexDouble}) {
    const at::Tensor t = torch::complex(base.to(c10::toRealValueType(dtype)), -base.to(c10::toRealValueType(dtype)));
    cases.push_back({tp::dtype_name(dtype).substr(6), t});
    cases.push_back({tp::dtype_name(dtype).substr(6) + "_conj_view", t.conj()});
  }
  cases.push_back({"expanded", torch::arange(4, at::kFloat).expand({3, 4})});
  cases.push_back({"zero_dim", torch::tensor(-3.5)});
  cases.push_back({"empty", torch::zeros({0, 3})});
  cases.push_back({"slice_of_large", torch::arange(1 << 20, at::kInt).slice(0, 100, 110)});
  for (const Case& c : cases) dbg.save(c.t, c.name, /*save_backward=*/false);
  dbg.step();

  // The expected values travel to python as raw bytes, independently of the .pt format.
  const std::string dir = tmp.path() + "/step0/" + proc_dir() + "/dump_tensor_data";
  std::string script = "import torch, sys\nok = True\n";
  for (const Case& c : cases) {
    const at::Tensor expected = c.t.resolve_conj().contiguous();
    const std::string raw = dir + "/" + c.name + ".raw";
    std::ofstream(raw, std::ios::binary)
        .write(static_cast<const char*>(expected.data_ptr()), static_cast<std::streamsize>(expected.nbytes()));
    std::string shape;
    for (auto s : expected.sizes()) shape += std::to_string(s) + ",";
    script += "t = torch.load('" + dir + "/" + c.name +
              ".0.debug.pt')\n"
              "e = torch.frombuffer(bytearray(open('" +
              raw + "', 'rb').read()) + bytearray(16), dtype=" + tp::dtype_name(c.t.scalar_type()) +
              ")[:" + std::to_string(expected.numel()) + "].reshape((" + shape +
              "))\n"
              "good = t.dtype == e.dtype and t.shape == e.shape and t.is_contiguous() and not t.requires_grad and "
              "torch.equal(t, e)\n"
              "ok = ok and good\n"
              "print('" +
              c.name + "', good)\n";
  }
  script += "sys.exit(0 if ok else 1)\n";
  int rc = -1;
  const std::string out = tptest::run_python(script, &rc);
  CAPTURE(out);
  CHECK(rc == 0);
  // A view is saved alone, not with its whole storage (libtorch-notes §5).
  CHECK(fs::file_size(dir + "/slice_of_large.0.debug.pt") < 4096);
}

TEST_CASE("the tensor task names files as msprobe does, with data_name after requires_grad and dump_data_dir set") {
  tptest::TempDir tmp;
  {
    tp::Debugger<tp::Level::Mix, tp::Task::Tensor> dbg(tp::Options().dump_path(tmp.path()));
    torch::manual_seed(1234);
    Net net;
    const auto x = torch::randn({2, 8}, torch::requires_grad());
    {
      tp::ScopedDump scope(dbg, net);
      net->forward(x).sum().backward();
    }
    dbg.step();
  }
  const std::string rank = tmp.path() + "/step0/" + proc_dir();
  const Json dump = tptest::read_json(rank + "/dump.json");
  CHECK(dump["task"] == "tensor");
  CHECK(dump["dump_data_dir"] == rank + "/dump_tensor_data");
  const Json& data = dump["data"];
  std::vector<std::string> names;
  collect_data_names(data, names);
  // Exactly the files dump.json names, each once, nothing else (no temporary files, no journal).
  CHECK(std::set<std::string>(names.begin(), names.end()).size() == names.size());
  CHECK(files_in(rank + "/dump_tensor_data") == std::set<std::string>(names.begin(), names.end()));
  CHECK_FALSE(fs::exists(rank + "/journal.jsonl"));

  // Module files have msprobe's names exactly (API names differ by design: Aten.* for Functional.*).
  const Json ref = tptest::read_json(std::string(TORCHPROBE_TESTS_DIR) +
                                     "/data/reference-dumps/tensor_mix/step0/proc10275/dump.json")["data"];
  std::vector<std::string> ref_names;
  collect_data_names(ref, ref_names);
  std::set<std::string> ref_module_files, our_module_files;
  for (const auto& n : ref_names)
    if (n.rfind("Module.", 0) == 0) ref_module_files.insert(n);
  for (const auto& n : names)
    if (n.rfind("Module.", 0) == 0) our_module_files.insert(n);
  CHECK(our_module_files == ref_module_files);
  CHECK(our_module_files.count("Module.fc.Linear.forward.0.parameters.weight.pt") == 1);
  CHECK(our_module_files.count("Module.fc.Linear.parameters_grad.0.bias.pt") == 1);
  CHECK(our_module_files.count("Module.fc.Linear.backward.0.output.0.pt") == 1);

  // Each tensor item has msprobe's keys in msprobe's order.
  const std::vector<std::string> keys = {"type", "dtype", "shape",         "Max",      "Min",
                                         "Mean", "Norm",  "requires_grad", "data_name"};
  CHECK(names_of(data["Module.fc.Linear.forward.0"]["parameters"]["weight"]) == keys);
  CHECK(names_of(ref["Module.fc.Linear.forward.0"]["parameters"]["weight"]) == keys);
  CHECK(data["Module.fc.Linear.forward.0"]["input_args"][0]["data_name"] == "Module.fc.Linear.forward.0.input.0.pt");
  CHECK(data["Aten.addmm.0.forward"]["input_args"][1]["data_name"] == "Aten.addmm.0.forward.input.1.pt");
  CHECK(data["Aten.addmm.0.forward"]["output"][0]["data_name"] == "Aten.addmm.0.forward.output.0.pt");
  CHECK(data["Aten.relu.0.backward"]["input"][0]["data_name"] == "Aten.relu.0.backward.input.0.pt");
  CHECK(data["Module.fc.Linear.parameters_grad.0"]["weight"][0]["data_name"] ==
        "Module.fc.Linear.parameters_grad.0.weight.pt");

  // python loads every file, and its statistics agree with the item that names it.
  int rc = -1;
  const std::string out = tptest::run_python(
      "import json, torch\n"
      "d = json.load(open('" +
          rank +
          "/dump.json'))\n"
          "bad = []\n"
          "def walk(v):\n"
          "    if isinstance(v, dict):\n"
          "        if 'data_name' in v:\n"
          "            t = torch.load(d['dump_data_dir'] + '/' + v['data_name'])\n"
          "            if list(t.shape) != v['shape'] or str(t.dtype) != v['dtype'] or t.max().item() != v['Max'] or "
          "t.min().item() != v['Min']:\n"
          "                bad.append(v['data_name'])\n"
          "        for x in v.values(): walk(x)\n"
          "    elif isinstance(v, list):\n"
          "        for x in v: walk(x)\n"
          "walk(d['data'])\n"
          "print('bad', bad)\n",
      &rc);
  CHECK(rc == 0);
  CHECK(out == "bad []\n");
}

TEST_CASE("a tensor is saved as it was when the call began: an in-place op's input file holds the old values") {
  tptest::TempDir tmp;
  {
    tp::Debugger<tp::Level::L1, tp::Task::Tensor> dbg(tp::Options().dump_path(tmp.path()));
    at::Tensor x = torch::ones({4});
    dbg.start();
    x.add_(1);
    x.mul_(3);
    dbg.stop();
  }
  const std::string dir = tmp.path() + "/step0/" + proc_dir() + "/dump_tensor_data/";
  CHECK(torch::equal(load_pt(dir + "Aten.add_.0.forward.input.0.pt"), torch::ones({4})));
  CHECK(torch::equal(load_pt(dir + "Aten.add_.0.forward.output.0.pt"), torch::full({4}, 2.0)));
  CHECK(torch::equal(load_pt(dir + "Aten.mul_.0.forward.input.0.pt"), torch::full({4}, 2.0)));
  CHECK(torch::equal(load_pt(dir + "Aten.mul_.0.forward.output.0.pt"), torch::full({4}, 6.0)));
}

TEST_CASE(
    "list, scope and data_mode choose the saved tensors; statistics saves only tensor_list entries; no writer "
    "otherwise") {
  tptest::TempDir tmp;
  auto run = [&](const std::string& sub, auto dbg_tag, tp::Options opts) {
    using D = typename decltype(dbg_tag)::type;
    D dbg(opts.dump_path(tmp / sub));
    torch::manual_seed(1);
    const auto x = torch::randn({3, 3}, torch::requires_grad());
    dbg.start();
    torch::relu(torch::sigmoid(x)).sum().backward();
    dbg.stop();
    dbg.wait_written();
    return std::make_pair(tptest::read_json(tmp / sub + "/step0/" + proc_dir() + "/dump.json"),
                          files_in(tmp / sub + "/step0/" + proc_dir() + "/dump_tensor_data"));
  };
  struct TensorL1 {
    using type = tp::Debugger<tp::Level::L1, tp::Task::Tensor>;
  };
  struct StatsL1 {
    using type = tp::Debugger<tp::Level::L1, tp::Task::Statistics>;
  };

  auto [listed, listed_files] = run("list", TensorL1{}, tp::Options().list({"relu"}));
  for (const auto& f : listed_files) CHECK(f.find("relu") != std::string::npos);
  CHECK(listed_files.count("Aten.relu.0.forward.input.0.pt") == 1);
  CHECK(listed_files.count("Aten.relu.0.backward.output.0.pt") == 1);

  auto [inputs, input_files] = run("data_mode", TensorL1{}, tp::Options().data_mode({"forward", "input"}));
  CHECK_FALSE(input_files.empty());
  for (const auto& f : input_files) CHECK(f.find(".forward.input.") != std::string::npos);

  auto [stats, stats_files] = run("tensor_list", StatsL1{}, tp::Options().tensor_list({"sigmoid"}));
  CHECK(stats["dump_data_dir"] == tmp / "tensor_list/step0/" + proc_dir() + "/dump_tensor_data");
  CHECK(stats["data"]["Aten.sigmoid.0.forward"]["output"][0]["data_name"] == "Aten.sigmoid.0.forward.output.0.pt");
  CHECK_FALSE(stats["data"]["Aten.relu.0.forward"]["output"][0].contains("data_name"));
  for (const auto& f : stats_files) CHECK(f.find("sigmoid") != std::string::npos);
  CHECK(stats_files.size() == 4);  // forward input/output, backward input/output

  auto [plain, plain_files] = run("plain", StatsL1{}, tp::Options());
  CHECK(plain["dump_data_dir"].is_null());
  CHECK_FALSE(fs::exists(tmp / "plain/step0/" + proc_dir() + "/dump_tensor_data"));
  tp::Debugger<tp::Level::L1, tp::Task::Statistics> stats_only(tp::Options().dump_path(tmp / "x"));
  CHECK_FALSE(stats_only.task().saver().enabled());  // a statistics run has no writer and no thread
}

namespace {
// A task that keeps only entries whose name contains "keep": the contract other tasks rely on
// (overflow_check decides in keep()): files of dropped entries are never written. It saves through
// the Recorder's writer, as every task that saves tensors does.
struct SelectiveTask : tp::StatisticsTask {
  SelectiveTask(const tp::Config& c, tp::TensorSaver saver)
      : StatisticsTask(c, std::move(saver), /*save_every_tensor=*/true) {}
  bool keep(tp::Record& r) const { return r.name.find("keep") != std::string::npos; }
};
}  // namespace

TEST_CASE("Recorder hands a kept entry's tensors to the writer and frees a dropped entry's") {
  tptest::TempDir tmp;
  tp::Config config = tp::Options().dump_path(tmp.path()).set("task", "tensor").resolve();
  auto core = std::make_shared<tp::details::Recorder<SelectiveTask>>(config);
  core->set_step_directory(tmp.path());
  fs::create_directories(tmp / "dump_tensor_data");
  for (const std::string name : {"keep.0.forward", "drop.0.forward"}) {
    tp::Record r;
    r.name = name;
    r.body["output"] = core->task().describe(torch::ones({1000}), tp::Site{"/output", "output.0"}, r);
    CHECK(r.saves.size() == 1);
    core->commit(std::move(r));
  }
  core->flush_tensor_files();
  CHECK(files_in(tmp / "dump_tensor_data") == std::set<std::string>{"keep.0.forward.output.0.pt"});
  const auto stats = core->task().saver().writer()->stats();
  CHECK(stats.files == 1);
  CHECK(stats.peak_held_bytes >= 4000);
  CHECK(stats.held_bytes == 0);  // the dropped entry's snapshot was freed too
}

TEST_CASE("under a burst the memory held by pending tensor files stays under max_pending_mb, and every file arrives") {
  tptest::TempDir tmp;
  tp::Debugger<tp::Level::L1, tp::Task::Tensor> dbg(
      tp::Options().dump_path(tmp.path()).max_pending_mb(4).extra_info(false));
  const at::Tensor a = torch::ones({256 * 1024});  // 1 MiB
  constexpr int kCalls = 60;                       // 180 MiB of snapshots
  dbg.start();
  for (int i = 0; i < kCalls; ++i) torch::add(a, a);
  dbg.stop();
  dbg.wait_written();  // the tensor files, then dump.json
  const auto stats = dbg.task().saver().writer()->stats();
  CAPTURE(stats.peak_held_bytes);
  CHECK(stats.peak_held_bytes <= std::size_t{4} << 20);
  // Whether the training thread had to wait depends on how fast the writer ran against it (under
  // load it may keep up); the cap above is the invariant, this only says whether it was reached.
  if (stats.waits == 0) MESSAGE("the writer kept up: max_pending_mb was not reached in this run");
  CHECK(stats.files == 3 * kCalls);
  CHECK(stats.failures == 0);
  CHECK(files_in(tmp.path() + "/step0/" + proc_dir() + "/dump_tensor_data").size() == 3 * kCalls);
  // The 1 MiB snapshots went to the disk straight from memory, all but their first partial block
  // (and, being a whole number of blocks long, their last 64 bytes).
  if (tp::io::direct_io_supported(tmp.path()))
    CHECK(stats.direct_bytes == 3 * kCalls * ((std::uint64_t{1} << 20) - 4096));
  else
    CHECK(stats.direct_bytes == 0);
  const std::string file = tmp.path() + "/step0/" + proc_dir() + "/dump_tensor_data/Aten.add.59.forward.output.0.pt";
  CHECK(torch::equal(load_pt(file), a + a));
}

TEST_CASE("max_pending_mb is validated like every key") {
  CHECK(tp::Options().dump_path("/tmp/x").resolve().max_pending_mb == 1024);
  CHECK(tp::Options().dump_path("/tmp/x").max_pending_mb(16).resolve().max_pending_mb == 16);
  for (const nlohmann::json& bad :
       {nlohmann::json(0), nlohmann::json(-5), nlohmann::json("64"), nlohmann::json(2.5), nlohmann::json(true)})
    CHECK_THROWS_WITH_AS(tp::Options().dump_path("/tmp/x").set("max_pending_mb", bad).resolve(),
                         doctest::Contains("\"max_pending_mb\""), tp::ConfigError);
}

// ---- save() -----------------------------------------------------------------------------------

namespace {
// Same keys in the same order and the same values; Norm within float32 rounding (msprobe computes it
// in float32, TorchProbe in float64).
void check_same_item(const Json& ours, const Json& theirs) {
  CAPTURE(ours.dump());
  CAPTURE(theirs.dump());
  REQUIRE(names_of(ours) == names_of(theirs));
  for (const auto& kv : theirs.items()) {
    if (kv.key() == "Norm")
      CHECK(ours["Norm"].get<double>() == doctest::Approx(kv.value().get<double>()).epsilon(1e-6));
    else
      CHECK(ours[kv.key()] == kv.value());
  }
}

// The program of msprobe's save_debug_statistics reference: save y, a mix of values, y again; backward.
template <class D>
void run_save_program(D& dbg) {
  for (int s = 0; s < 2; ++s) {
    torch::manual_seed(0);
    const auto x = torch::randn({2, 3}, torch::requires_grad());
    const auto y = x * 2;
    dbg.save(y, "y");
    dbg.save(tp::SaveValue::dict({{"a", y}, {"b", tp::SaveValue::list({1, 2.5, "s"})}}), "mix");
    dbg.save(y, "y");
    y.sum().backward();
    dbg.step();
  }
}
}  // namespace

TEST_CASE("save() writes debug.json as msprobe does, the gradient entries filled by backward") {
  tptest::TempDir tmp;
  const std::string cfg = tmp / "config.json";
  std::ofstream(cfg) << R"({"task": "statistics", "dump_path": ")" << tmp / "dump"
                     << R"(", "level": "debug"})";
  {
    tp::PrecisionDebugger dbg(cfg);
    run_save_program(dbg);
  }
  const Json ref = tptest::read_json(std::string(TORCHPROBE_TESTS_DIR) +
                                     "/data/reference-dumps/save_debug_statistics/step0/proc11590/debug.json");
  for (int s = 0; s < 2; ++s) {
    CAPTURE(s);
    const std::string rank = tmp / "dump/step" + std::to_string(s) + "/" + proc_dir();
    CHECK(files_in(rank) == std::set<std::string>{"debug.json"});  // level debug writes nothing else
    const Json ours = tptest::read_json(rank + "/debug.json");
    CHECK(names_of(ours) == names_of(ref));
    CHECK(ours["task"] == "statistics");
    CHECK(ours["level"] == "debug");
    CHECK(ours["dump_data_dir"].is_null());
    CHECK(names_of(ours["data"]) == names_of(ref["data"]));
    const Json& d = ours["data"];
    CHECK(names_of(d["y.0.debug"]) == names_of(ref["data"]["y.0.debug"]));
    CHECK(d["y.0.debug"]["requires_grad"] == true);
    CHECK(d["mix.0.debug"]["b"] == ref["data"]["mix.0.debug"]["b"]);
    CHECK(d["mix_grad.0.debug"]["b"] == ref["data"]["mix_grad.0.debug"]["b"]);  // [null, null, null]
    // The gradients are all ones, as in msprobe's dump of the same shapes.
    check_same_item(d["y_grad.0.debug"], ref["data"]["y_grad.0.debug"]);
    check_same_item(d["y_grad.1.debug"], ref["data"]["y_grad.1.debug"]);
    check_same_item(d["mix_grad.0.debug"]["a"], ref["data"]["mix_grad.0.debug"]["a"]);
  }
}

TEST_CASE("save() with the tensor task writes {name}.{count}.debug[.index].pt, also beside dump.json at level L1") {
  tptest::TempDir tmp;
  {
    tp::Debugger<tp::Level::L1, tp::Task::Tensor> dbg(tp::Options().dump_path(tmp.path()));
    dbg.start();
    run_save_program(dbg);  // steps while running: the capture continues into each new step
    dbg.stop();
  }
  const std::string rank = tmp.path() + "/step0/" + proc_dir();
  CHECK(fs::exists(rank + "/dump.json"));
  const Json debug = tptest::read_json(rank + "/debug.json");
  CHECK(debug["task"] == "tensor");
  CHECK(debug["level"] == "debug");
  CHECK(debug["dump_data_dir"] == rank + "/dump_tensor_data");
  CHECK(debug["data"]["y.0.debug"]["data_name"] == "y.0.debug.pt");
  CHECK(debug["data"]["y_grad.1.debug"]["data_name"] == "y_grad.1.debug.pt");
  CHECK(debug["data"]["mix.0.debug"]["a"]["data_name"] == "mix.0.debug.a.pt");
  CHECK(debug["data"]["mix_grad.0.debug"]["a"]["data_name"] == "mix_grad.0.debug.a.pt");
  const std::string files = rank + "/dump_tensor_data/";
  CHECK(torch::equal(load_pt(files + "y_grad.0.debug.pt"), torch::ones({2, 3})));
  torch::manual_seed(0);
  CHECK(torch::equal(load_pt(files + "mix.0.debug.a.pt"), torch::randn({2, 3}) * 2));
  // the L1 capture also saw the ops: dump.json is beside debug.json
  CHECK(tptest::read_json(rank + "/dump.json")["data"].contains("Aten.mul.0.forward"));
}

// ---- journal and crash recovery -------------------------------------------------------------

namespace {
struct NumberedLine final : tp::io::JournalLine {
  NumberedLine(int n, std::atomic<int>* made) : n(n), made(made) {}
  void write(tp::io::JsonText& out) const override {
    ++*made;
    out.raw("{\"n\": " + std::to_string(n) + "}");
  }
  void failed(int) const override {}
  int n;
  std::atomic<int>* made;
};
}  // namespace

TEST_CASE(
    "the journal's own thread makes and writes queued lines in order; drain() waits for them, remove() drops them") {
  tptest::TempDir tmp;
  std::atomic<int> made{0};
  tp::io::Journal journal;
  journal.open(tmp / "j.jsonl", "{\"journal\": 1}");
  const int lines = 3 * static_cast<int>(tp::io::Journal::kMaxQueued);  // past the queue's bound: the caller waits
  for (int i = 0; i < lines; ++i) journal.append_later(std::make_unique<NumberedLine>(i, &made));
  journal.drain();
  CHECK(made.load() == lines);
  std::ifstream in(tmp / "j.jsonl");
  std::string line;
  REQUIRE(std::getline(in, line));
  CHECK(line == "{\"journal\": 1}");
  int expected = 0;
  while (std::getline(in, line)) {
    CHECK(line == "{\"n\": " + std::to_string(expected) + "}");
    ++expected;
  }
  CHECK(expected == lines);
  // remove(): the step's files are complete; what is still queued is not needed any more.
  for (int i = 0; i < 1000; ++i) journal.append_later(std::make_unique<NumberedLine>(i, &made));
  journal.remove();
  CHECK_FALSE(fs::exists(tmp / "j.jsonl"));
}

namespace {
// A line whose text waits until `open` is set: the journal's thread is stuck making it.
struct BlockedLine final : tp::io::JournalLine {
  explicit BlockedLine(std::atomic<bool>* open) : open(open) {}
  void write(tp::io::JsonText& out) const override {
    while (!open->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    out.raw("{}");
  }
  void failed(int) const override {}
  std::atomic<bool>* open;
};
}  // namespace

TEST_CASE("at most kMaxQueued journal lines are unwritten: past them the capturing thread waits for the writes") {
  tptest::TempDir tmp;
  std::atomic<bool> open{false};
  tp::io::Journal journal;
  journal.open(tmp / "j.jsonl", "{\"journal\": 1}");
  // The journal's thread takes the first line and is stuck making it; the other lines wait behind it.
  for (std::size_t i = 0; i < tp::io::Journal::kMaxQueued; ++i)
    journal.append_later(std::make_unique<BlockedLine>(&open));
  std::atomic<bool> appended{false};
  std::thread capture([&] {
    journal.append_later(std::make_unique<BlockedLine>(&open));  // the (N+1)th unwritten line
    appended = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK_FALSE(appended.load());  // waits: a crash now would lose at most kMaxQueued lines
  open = true;
  capture.join();
  CHECK(appended.load());
  journal.drain();
  CHECK(tptest::read_text(tmp / "j.jsonl").size() ==
        std::string("{\"journal\": 1}\n").size() + 3 * (tp::io::Journal::kMaxQueued + 1));
}

TEST_CASE("a new journal appears with its header in it; recover_dump.py clears an empty or half-created journal") {
  tptest::TempDir tmp;
  {
    tp::io::Journal journal;
    journal.open(tmp / "j.jsonl", "{\"journal\": 1}");
    // Before any line is written the file already holds its header, and no temporary file is left.
    CHECK(files_in(tmp.path()) == std::set<std::string>{"j.jsonl"});
    std::ifstream in(tmp / "j.jsonl");
    std::string line;
    REQUIRE(std::getline(in, line));
    CHECK(line == "{\"journal\": 1}");
  }
  // What a process killed by something other than TorchProbe's writer could still leave behind.
  fs::create_directories(tmp / "dump/step0/rank0");
  fs::create_directories(tmp / "dump/step1/rank0");
  std::ofstream(tmp / "dump/step0/rank0/journal.jsonl").close();
  std::ofstream(tmp / "dump/step1/rank0/.journal.jsonl.tmp4242") << "{\"journal\": 1}\n";
  const int rc = std::system(
      (std::string(TORCHPROBE_PYTHON) + " " + recover_tool() + " " + tmp / "dump" + " > /dev/null").c_str());
  CHECK(rc == 0);
  CHECK(files_in(tmp / "dump/step0/rank0").empty());
  CHECK(files_in(tmp / "dump/step1/rank0").empty());
}

TEST_CASE(
    "while a step runs its entries are in the journal; recover_dump.py rebuilds a finished step byte for byte and "
    "marks "
    "an interrupted one incomplete") {
  tptest::TempDir tmp;
  const std::string rank = tmp.path() + "/step0/" + proc_dir();
  const std::string cut = tmp / "cut/step0/" + proc_dir();        // killed between stop() and step()
  const std::string finished = tmp / "done/step0/" + proc_dir();  // killed after step() returned
  {
    tp::Debugger<tp::Level::Mix, tp::Task::Tensor> dbg(tp::Options().dump_path(tmp.path()));
    torch::manual_seed(1234);
    Net net;
    dbg.start(net);
    net->forward(torch::randn({2, 8}, torch::requires_grad())).sum().backward();
    dbg.save(torch::ones({2}), "s");
    CHECK_FALSE(fs::exists(rank + "/dump.json"));
    dbg.stop();
    dbg.wait_written();  // the step's dump.json, and so every journal line before it
    // Had the process died now, this journal is what it would leave (stop() is not the end of the step).
    fs::create_directories(cut);
    fs::copy_file(rank + "/journal.jsonl", cut + "/journal.jsonl");
    // step() returns once every line of the step, its trailer too, is written: with the writer held
    // back, the journal is what a process killed right after step() leaves.
    dbg.background_writer().pause();
    dbg.step();
    fs::create_directories(finished);
    fs::copy_file(rank + "/journal.jsonl", finished + "/journal.jsonl");
    dbg.background_writer().resume();
    dbg.wait_written();
    CHECK_FALSE(fs::exists(rank + "/journal.jsonl"));
  }
  const std::size_t entries = tptest::read_json(rank + "/dump.json")["data"].size();
  auto recover = [&](const std::string& root, int want_rc) {
    int rc = -1;
    const std::string out = tptest::run_python(
        "import subprocess, sys\n"
        "r = subprocess.run([sys.executable, '" +
            recover_tool() + "', '" + root +
            "'])\n"
            "sys.exit(r.returncode)\n",
        &rc);
    CAPTURE(out);
    CHECK(rc == want_rc);
    CHECK(out.find("recovered " + std::to_string(entries) + " dump entries and 2 debug entries") != std::string::npos);
    return out;
  };
  // The finished step: byte for byte what the Debugger wrote, but for the directory's name inside.
  const std::string out = recover(tmp / "done", 0);
  CHECK(out.find("incomplete") == std::string::npos);
  CHECK_FALSE(fs::exists(finished + "/journal.jsonl"));
  auto same_but_path = [&](const std::string& file) {
    std::string ours = tptest::read_text(rank + "/" + file), recovered = tptest::read_text(finished + "/" + file);
    for (std::size_t p; (p = recovered.find(tmp / "done")) != std::string::npos;)
      recovered.replace(p, (tmp / "done").size(), tmp.path());
    CHECK(recovered == ours);
  };
  same_but_path("dump.json");
  same_but_path("construct.json");
  same_but_path("debug.json");
  // The interrupted one: every entry (nothing was lost here), but no trailer, so recovery cannot
  // know that: marked incomplete, exit status 3.
  const std::string cut_out = recover(tmp / "cut", 3);
  CHECK(cut_out.find(cut + ": incomplete: missing the step was interrupted") != std::string::npos);
  const Json got = tptest::read_json(cut + "/dump.json"), want = tptest::read_json(rank + "/dump.json");
  CHECK(got["data"] == want["data"]);
  CHECK(got["torchprobe_recovery"]["complete"] == false);
  CHECK(got["torchprobe_recovery"]["entries_recovered"] == entries);
}

// ---- errors and permissions -----------------------------------------------------------------

TEST_CASE(
    "a full disk (file size limit) is logged to dump_error_info.log and the run goes on; written files stay valid") {
  tptest::TempDir tmp;
  const pid_t pid = tptest::spawn_child("fsize", {"TORCHPROBE_TEST_DIR=" + tmp.path()});
  const int status = tptest::wait_child(pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);  // the child ran to its end
  for (int s = 0; s < 2; ++s) {
    CAPTURE(s);
    std::string rank;
    for (const auto& e : fs::directory_iterator(tmp / ("step" + std::to_string(s)))) rank = e.path().string();
    const Json data = tptest::read_json(rank + "/dump.json")["data"];
    for (const char* entry : {"Aten.neg.0.forward", "Aten.sigmoid.0.forward", "Aten.exp.0.forward"})
      CHECK(data.contains(entry));
    const std::string files = rank + "/dump_tensor_data/";
    CHECK(torch::equal(load_pt(files + "Aten.neg.0.forward.output.0.pt"), -torch::ones({16})));
    CHECK(torch::equal(load_pt(files + "Aten.exp.0.forward.output.0.pt"), torch::ones({4})));
    CHECK_FALSE(fs::exists(files + "Aten.sigmoid.0.forward.output.0.pt"));
    for (const auto& f : files_in(files)) CHECK(f[0] != '.');  // no temporary file left behind
    const std::string log = tptest::read_text(rank + "/dump_error_info.log");
    CAPTURE(log);
    CHECK(log.find("] [ERROR] save_tensor failed: name=Aten.") != std::string::npos);
    CHECK(log.find(", pid=") != std::string::npos);
    CHECK(log.find("File too large") != std::string::npos);
    CHECK(log.find("[ERROR]") == log.rfind("[ERROR]"));  // once per kind of failure and step
    CHECK_FALSE(fs::exists(rank + "/journal.jsonl"));
  }
}

TEST_CASE("an unwritable dump_path is reported at start() and at the first save(), with the path") {
  tptest::TempDir tmp;
  std::ofstream(tmp / "file") << "x";
  const std::string target = tmp / "file/dump";  // below a regular file: fails even for root
  tp::Debugger<tp::Level::L1, tp::Task::Tensor> dbg(tp::Options().dump_path(target));
  CHECK_THROWS_WITH_AS(dbg.start(), doctest::Contains(target.c_str()), tp::io::IoError);
  CHECK_THROWS_WITH_AS(dbg.start(), doctest::Contains("Not a directory"), tp::io::IoError);
  CHECK_FALSE(dbg.running());
  CHECK_FALSE(at::hasCallbacks());
  CHECK_THROWS_WITH_AS(dbg.save(torch::ones({1}), "x"), doctest::Contains(target.c_str()), tp::io::IoError);
}

TEST_CASE("dump files are created 0640 and directories 0750 (under the usual umask 022)") {
  tptest::TempDir tmp;
  const mode_t old = ::umask(022);
  {
    tp::Debugger<tp::Level::L1, tp::Task::Tensor> dbg(tp::Options().dump_path(tmp / "d"));
    dbg.start();
    torch::neg(torch::ones({2}));
    dbg.save(torch::ones({1}), "s");
    struct stat st {};
    REQUIRE(::stat((tmp / "d/step0/" + proc_dir() + "/journal.jsonl").c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == 0640);
    dbg.stop();
  }
  ::umask(old);
  auto mode_of = [](const std::string& p) {
    struct stat st {};
    REQUIRE(::stat(p.c_str(), &st) == 0);
    return st.st_mode & 07777;
  };
  const std::string rank = tmp / "d/step0/" + proc_dir();
  CHECK(mode_of(tmp / "d") == 0750);
  CHECK(mode_of(tmp / "d/step0") == 0750);
  CHECK(mode_of(rank) == 0750);
  CHECK(mode_of(rank + "/dump_tensor_data") == 0750);
  for (const std::string f : {"dump.json", "stack.json", "construct.json", "debug.json",
                              "dump_tensor_data/Aten.neg.0.forward.output.0.pt", "dump_tensor_data/s.0.debug.pt"}) {
    CAPTURE(f);
    CHECK(mode_of(rank + "/" + f) == 0640);
  }
}

TEST_CASE("names from op and module names cannot leave dump_tensor_data") {
  tptest::TempDir tmp;
  {
    tp::Debugger<tp::Level::Debug, tp::Task::Tensor> dbg(tp::Options().dump_path(tmp / "d"));
    dbg.save(torch::ones({1}), "../../escape");
    dbg.save(tp::SaveValue::dict({{"a/b", torch::ones({1})}}), "k");
  }
  const std::string files = tmp / "d/step0/" + proc_dir() + "/dump_tensor_data";
  CHECK(files_in(files) == std::set<std::string>{".._.._escape.0.debug.pt", "k.0.debug.a_b.pt"});
  CHECK(files_in(tmp.path()) == std::set<std::string>{"d"});
}
