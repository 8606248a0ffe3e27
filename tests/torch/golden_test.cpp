// Golden outputs: a fixed set of deterministic programs is dumped with the current library and every
// file it writes is compared byte for byte with the copy kept in tests/data/golden/torch-{X.Y}/
// (one set per libtorch major.minor: .pt containers and TorchScript graphs may differ between
// versions). A refactor that changes one digit, one key's place or one byte of a .pt fails here.
//
//   TORCHPROBE_UPDATE_GOLDEN=1 ./build/tests/torchprobe_tests -tc="golden*"
//
// writes the files instead of comparing (then review `git diff tests/data/golden`). docs/golden.md.
//
// What is compared: every file under each step's rank directory, by relative path, except
// stack.json (frame addresses and line numbers). The only normalisation: in *.json files the
// absolute temporary dump directory (dump_data_dir) is replaced by "{dump_path}".
//
// Parameters and inputs are rounded to multiples of 1/8, so every sum of products in forward and
// backward is exact in fp32 and every statistic exact in double before its last rounding: BLAS
// kernels, summation order, thread count and SIMD width cannot change a bit of the outputs.
#include <torch/torch.h>
#include <torch/script.h>
#include <torch/version.h>
#include <doctest/doctest.h>

#include <torchprobe/analysis/compare/dump_reader.hpp>
#include <torchprobe/torchprobe.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "test_support.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;

namespace {

using Files = std::map<std::string, std::string>;  // path relative to the dump directory -> bytes
constexpr const char* kDumpPathToken = "{dump_path}";

std::string golden_set() {
  return "torch-" + std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR);
}
std::string golden_root() { return std::string(TORCHPROBE_TESTS_DIR) + "/data/golden/" + golden_set(); }
bool updating() {
  const char* v = std::getenv("TORCHPROBE_UPDATE_GOLDEN");
  return v && std::string(v) == "1";
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}

// Every file below `dir` but stack.json, with `dir` itself replaced by kDumpPathToken in the JSON files.
Files collect_dump(const std::string& dir) {
  Files out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    // ranks_digest.bin is checked against its dump.json instead (check_digests): the golden sets of
    // both libtorch versions pin dump.json, of which the digest is a function.
    if (!e.is_regular_file() || e.path().filename() == "stack.json" ||
        e.path().filename() == torchprobe::io::kRankDigestFile)
      continue;
    std::string bytes = read_bytes(e.path());
    if (e.path().extension() == ".json") replace_all(bytes, dir, kDumpPathToken);
    out[fs::relative(e.path(), dir).generic_string()] = std::move(bytes);
  }
  return out;
}

Files read_golden(const std::string& dir) {
  Files out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).generic_string()] = read_bytes(e.path());
  return out;
}

// Where two versions of a file first differ: byte offset, and for text the line of each.
std::string first_difference(const std::string& want, const std::string& got) {
  std::size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  std::string msg = "first difference at byte " + std::to_string(i) + " (sizes " + std::to_string(want.size()) +
                    " vs " + std::to_string(got.size()) + ")";
  if (want.find('\0') == std::string::npos && got.find('\0') == std::string::npos) {
    auto line_at = [i](const std::string& s) {
      const std::size_t nl = i == 0 ? std::string::npos : s.rfind('\n', i - 1);
      const std::size_t start = nl == std::string::npos ? 0 : nl + 1;
      const std::size_t end = s.find('\n', start);
      return s.substr(start, end == std::string::npos ? std::string::npos : end - start);
    };
    msg += ", line " +
           std::to_string(1 + std::count(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(i), '\n')) +
           "\n  golden: " + line_at(want) + "\n  now:    " + line_at(got);
  }
  return msg;
}

// Every way `got` differs from `want`: a file missing, a file extra, a file's bytes.
std::vector<std::string> differences(const Files& want, const Files& got) {
  std::vector<std::string> out;
  for (const auto& [name, bytes] : want) {
    const auto it = got.find(name);
    if (it == got.end())
      out.push_back(name + ": in the golden set, not written now");
    else if (it->second != bytes)
      out.push_back(name + ": " + first_difference(bytes, it->second));
  }
  for (const auto& kv : got)
    if (!want.count(kv.first)) out.push_back(kv.first + ": written now, not in the golden set");
  return out;
}

// Every rank directory below `dir` has a ranks_digest.bin (the scenarios run with a rank) whose
// bytes are the digest of the dump.json beside it, as `torchprobe ranks` reads that file.
void check_digests(const std::string& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().filename() != "dump.json") continue;
    const fs::path digest = e.path().parent_path() / torchprobe::io::kRankDigestFile;
    CAPTURE(digest.string());
    REQUIRE(fs::exists(digest));
    const nlohmann::ordered_json doc = torchprobe::compare::read_json_file(e.path());
    torchprobe::io::RankDigestBuilder again;
    for (auto it = doc["data"].begin(); it != doc["data"].end(); ++it)
      again.add<torchprobe::io::rank_items::NlohmannNodes>(it.key(), &it.value());
    CHECK(read_bytes(digest) == torchprobe::io::encode_rank_digest(again.digest()));
  }
}

// Compares what the scenario wrote under `dump_dir` with its golden set, or, when updating,
// replaces the golden set by it.
// `root`: the golden set's folder (this libtorch's under tests/data/golden, or another for the test
// of the update itself).
void check_golden(const std::string& scenario, const std::string& dump_dir, const std::string& root = golden_root()) {
  const Files got = collect_dump(dump_dir);
  REQUIRE_FALSE(got.empty());
  const std::string dir = root + "/" + scenario;
  if (updating()) {
    tptest::remove_tree(dir);
    for (const auto& [name, bytes] : got) {
      fs::create_directories(fs::path(dir + "/" + name).parent_path());
      std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
    }
    MESSAGE("golden set written: " << dir << " (" << got.size() << " files)");
    return;
  }
  check_digests(dump_dir);
  const Files want = read_golden(dir);
  REQUIRE_MESSAGE(!want.empty(), "no golden files in " << dir << "; make them with TORCHPROBE_UPDATE_GOLDEN=1");
  for (const std::string& d : differences(want, got)) FAIL_CHECK(scenario << "/" << d);
}

// Neither updating nor a golden set for this libtorch: say so (a visible skip) rather than fail.
#define GOLDEN_REQUIRES_SET()                    \
  if (!updating() && !fs::exists(golden_root())) \
  TP_SKIP("no golden set " << golden_set() << " in tests/data/golden; make one with TORCHPROBE_UPDATE_GOLDEN=1")

torch::Tensor eighths(const torch::Tensor& t) { return torch::round(t * 8) / 8; }

void round_parameters(torch::nn::Module& m) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.parameters()) p.copy_(eighths(p));
}

// examples/quick_start.cpp's program (seed 1234, Linear(8, 4) then relu, steps of randn(2, 8)),
// its parameters and inputs rounded to eighths; rank 0.
template <class D>
void run_quick_start(D& dbg, int steps = 2) {
  torch::manual_seed(1234);
  tptest::Net net;
  round_parameters(*net);
  for (int s = 0; s < steps; ++s) {
    const auto x = eighths(torch::randn({2, 8})).requires_grad_();
    {
      tp::ScopedDump scope(dbg, net, 0);
      net->forward(x).sum().backward();
    }
    dbg.step();
    dbg.wait_written();
  }
}

// examples/module_levels.cpp's model: a guarded block and a probed Sequential.
struct BlockImpl : torch::nn::Module {
  BlockImpl() : proj(register_module("proj", torch::nn::Linear(8, 8))) {}
  torch::Tensor forward(torch::Tensor x) {
    tp::ModuleGuard guard(this, x);
    return torch::relu(proj(x)) + x;
  }
  torch::nn::Linear proj;
};
TORCH_MODULE(Block);

struct ModulesNetImpl : torch::nn::Module {
  ModulesNetImpl()
      : block(register_module("block", Block())),
        head(register_module("head", tp::probe_children(torch::nn::Sequential(
                                         torch::nn::Linear(8, 4), torch::nn::ReLU(), torch::nn::Linear(4, 1))))) {}
  torch::Tensor forward(torch::Tensor x) { return head->forward(block(x)); }
  Block block;
  torch::nn::Sequential head;
};
TORCH_MODULE(ModulesNet);

// overflow_test.cpp's planted overflow: fc(ones) = 8 in fp16, "* 10000" overflows, "+ 1" and sum carry it.
struct ForwardOverflowImpl : torch::nn::Module {
  ForwardOverflowImpl() : fc(register_module("fc", torch::nn::Linear(8, 4))) {
    torch::NoGradGuard no_grad;
    fc->weight.fill_(1.0);
    fc->bias.zero_();
  }
  torch::Tensor forward(const torch::Tensor& x) { return (fc(x).to(torch::kHalf) * 10000 + 1).sum(); }
  torch::nn::Linear fc;
};
TORCH_MODULE(ForwardOverflow);

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
TORCH_MODULE(ExpBlock);

struct ExpNetImpl : torch::nn::Module {
  ExpNetImpl() : block(register_module("block", ExpBlock())) {}
  torch::Tensor forward(const torch::Tensor& x) { return block(x).sum(); }
  ExpBlock block;
};
TORCH_MODULE(ExpNet);

}  // namespace

TEST_CASE("golden comparison reports a changed byte, a missing file and an extra file, and nothing for equal sets") {
  const Files want = {{"step0/rank0/dump.json", "{\n \"a\": 1.5\n}"}, {"step0/rank0/x.pt", std::string("PK\0\1", 4)}};
  CHECK(differences(want, want).empty());
  Files changed = want;
  changed["step0/rank0/dump.json"] = "{\n \"a\": 1.25\n}";
  const auto d = differences(want, changed);
  REQUIRE(d.size() == 1);
  CHECK(d[0] ==
        "step0/rank0/dump.json: first difference at byte 10 (sizes 13 vs 14), line 2\n  golden:  \"a\": 1.5\n  now:    "
        " \"a\": 1.25");
  Files binary = want;
  binary["step0/rank0/x.pt"][3] = '\2';
  CHECK(differences(want, binary) ==
        std::vector<std::string>{"step0/rank0/x.pt: first difference at byte 3 (sizes 4 vs 4)"});
  Files renamed = {{"step0/rank0/dump.json", want.at("step0/rank0/dump.json")},
                   {"step0/rank0/y.pt", want.at("step0/rank0/x.pt")}};
  CHECK(differences(want, renamed) == std::vector<std::string>{"step0/rank0/x.pt: in the golden set, not written now",
                                                               "step0/rank0/y.pt: written now, not in the golden set"});
  // The dump directory is replaced in JSON files only.
  tptest::TempDir tmp;
  std::ofstream(tmp / "d.json") << "{\"dump_data_dir\": \"" << tmp.path() << "/x\"}";
  std::ofstream(tmp / "d.pt") << tmp.path();
  const Files c = collect_dump(tmp.path());
  CHECK(c.at("d.json") == "{\"dump_data_dir\": \"{dump_path}/x\"}");
  CHECK(c.at("d.pt") == tmp.path());
}

TEST_CASE("TORCHPROBE_UPDATE_GOLDEN=1 writes the golden set that a run without it then matches byte for byte") {
  tptest::TempDir root, first, second;
  struct Unset {
    ~Unset() { ::unsetenv("TORCHPROBE_UPDATE_GOLDEN"); }
  } unset;
  ::setenv("TORCHPROBE_UPDATE_GOLDEN", "1", 1);
  {
    tp::Debugger<tp::Level::Mix, tp::Task::Statistics> dbg(tp::Options().dump_path(first.path()));
    run_quick_start(dbg);
  }
  check_golden("regenerated", first.path(), root.path());
  const Files written = read_golden(root / "regenerated");
  CHECK(written == collect_dump(first.path()));
  CHECK(written.count("step1/rank0/dump.json") == 1);
  ::unsetenv("TORCHPROBE_UPDATE_GOLDEN");
  {
    tp::Debugger<tp::Level::Mix, tp::Task::Statistics> dbg(tp::Options().dump_path(second.path()));
    run_quick_start(dbg);
  }
  check_golden("regenerated", second.path(), root.path());  // fails the case on any difference
  CHECK(read_golden(root / "regenerated") == written);      // and leaves the set as it was
}

TEST_CASE("golden: the quick-start model at mix with statistics, two steps" * TP_NEEDS("golden_set")) {
  GOLDEN_REQUIRES_SET();
  tptest::TempDir tmp;
  tp::Debugger<tp::Level::Mix, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp.path()));
  run_quick_start(dbg);
  check_golden("quick_start_mix", tmp.path());
}

TEST_CASE("golden: the quick-start model at mix with summary_mode md5" * TP_NEEDS("golden_set")) {
  GOLDEN_REQUIRES_SET();
  tptest::TempDir tmp;
  tp::Debugger<tp::Level::Mix, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp.path()).summary_mode("md5"));
  run_quick_start(dbg);
  check_golden("quick_start_md5", tmp.path());
}

TEST_CASE("golden: the tensor task at L1 and at mix, one step of the quick-start model: dump.json and the .pt files" *
          TP_NEEDS("golden_set")) {
  GOLDEN_REQUIRES_SET();
  for (const bool mix : {false, true}) {
    CAPTURE(mix);
    tptest::TempDir tmp;
    const auto opts = tp::Options().dump_path(tmp.path());
    if (mix) {
      tp::Debugger<tp::Level::Mix, tp::Task::Tensor> dbg(opts);
      run_quick_start(dbg, 1);
    } else {
      tp::Debugger<tp::Level::L1, tp::Task::Tensor> dbg(opts);
      run_quick_start(dbg, 1);
    }
    check_golden(mix ? "tensor_mix" : "tensor_L1", tmp.path());
  }
}

TEST_CASE("golden: overflow_check at L1 and at mix, with overflow_summary.json and the .pt files" *
          TP_NEEDS("golden_set")) {
  GOLDEN_REQUIRES_SET();
  {
    tptest::TempDir tmp;
    ForwardOverflow model;
    tp::Debugger<tp::Level::L1, tp::Task::OverflowCheck> dbg(tp::Options().dump_path(tmp.path()).overflow_nums(-1));
    {
      tp::ScopedDump scope(dbg, model, 0);
      model->forward(torch::ones({2, 8})).backward();
    }
    dbg.step();
    dbg.wait_written();
    check_golden("overflow_L1", tmp.path());
  }
  {
    tptest::TempDir tmp;
    ExpNet model;
    tp::Debugger<tp::Level::Mix, tp::Task::OverflowCheck> dbg(tp::Options().dump_path(tmp.path()).overflow_nums(-1));
    {
      tp::ScopedDump scope(dbg, model, 0);
      model->forward(torch::ones({1, 4})).backward();
    }
    dbg.step();
    dbg.wait_written();
    check_golden("overflow_mix", tmp.path());
  }
}

TEST_CASE("golden: save() of a tensor with its gradient, a list and a dict writes debug.json and the .pt files" *
          TP_NEEDS("golden_set")) {
  GOLDEN_REQUIRES_SET();
  tptest::TempDir tmp;
  tp::Debugger<tp::Level::Debug, tp::Task::Tensor> dbg(tp::Options().dump_path(tmp.path()));
  torch::manual_seed(1234);
  tptest::Net net;
  round_parameters(*net);
  const auto x = eighths(torch::randn({2, 8}));
  dbg.start(net, 0);
  const auto y = net->forward(x);
  dbg.save(y, "y");
  dbg.save(
      tp::SaveValue::dict({{"w", net->fc->bias.detach()}, {"meta", tp::SaveValue::list({1, 2.5, "s", true, nullptr})}}),
      "mixed");
  y.sum().backward();
  dbg.stop();
  dbg.step();
  dbg.wait_written();
  check_golden("save_debug", tmp.path());
}

TEST_CASE("golden: L0 with a ModuleGuard block and probe_children, statistics" * TP_NEEDS("golden_set")) {
  GOLDEN_REQUIRES_SET();
  tptest::TempDir tmp;
  tp::Debugger<tp::Level::L0, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp.path()));
  torch::manual_seed(1234);
  ModulesNet model;
  round_parameters(*model);
  const auto x = eighths(torch::randn({4, 8}));
  {
    tp::ScopedDump scope(dbg, model, 0);
    model->forward(x).sum().backward();
  }
  dbg.step();
  dbg.wait_written();
  check_golden("modules_L0", tmp.path());
}

TEST_CASE("golden: a TorchScript model scripted by python3 at mix" * TP_NEEDS("golden_set")) {
  GOLDEN_REQUIRES_SET();
  tptest::TempDir tmp;
  const std::string path = tmp / "net.pt";
  int rc = 0;
  // Weights set explicitly (no random draws), so the scripted file is the same whatever the RNG.
  const std::string out = tptest::run_python(
      "import torch\n"
      "class Net(torch.nn.Module):\n"
      "    def __init__(self):\n"
      "        super().__init__()\n"
      "        self.fc = torch.nn.Linear(8, 4)\n"
      "        with torch.no_grad():\n"
      "            self.fc.weight.copy_((torch.arange(32.0).reshape(4, 8) - 15) / 8)\n"
      "            self.fc.bias.copy_(torch.tensor([0.5, -0.25, 0.0, 1.0]))\n"
      "    def forward(self, x):\n"
      "        return torch.relu(self.fc(x))\n"
      "torch.jit.script(Net()).save('" +
          path + "')\n",
      &rc);
  REQUIRE_MESSAGE(rc == 0, out);
  torch::jit::Module scripted = torch::jit::load(path);
  tp::Debugger<tp::Level::Mix, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp / "dump"));
  const auto x = ((torch::arange(16, torch::kFloat).reshape({2, 8}) - 5) / 4).requires_grad_();
  {
    tp::ScopedDump scope(dbg, scripted, 0);
    scripted.forward({x}).toTensor().sum().backward();
  }
  dbg.step();
  dbg.wait_written();
  check_golden("torchscript_mix", tmp / "dump");
}
