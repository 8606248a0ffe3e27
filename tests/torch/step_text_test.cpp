// The step files written as text straight from the records (sink/step_text.hpp) must be the bytes
// that Python's json.dump(obj, f, indent=1) writes for the same document: checked against the JSON
// trees of StepDump (the path MemorySink uses) and against python3 re-dumping what it read.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <torchprobe/torchprobe.hpp>

#include "test_support.hpp"

namespace tp = torchprobe;

namespace tp_step_text_test {

using tp::capture::CapturedCall;
using tp::capture::CapturedValue;
using Json = nlohmann::ordered_json;

tp::TensorSummary summary(at::ScalarType dtype, std::vector<std::int64_t> shape, tp::TensorStats stats, bool rg) {
  tp::TensorSummary s;
  s.dtype = dtype;
  s.shape.assign(shape.begin(), shape.end());
  s.stats = stats;
  s.requires_grad = rg;
  return s;
}

CapturedCall::Item item(CapturedCall::Section section, CapturedValue v, const std::string* name = nullptr) {
  CapturedCall::Item i;
  i.section = section;
  i.name = name;
  i.value = std::move(v);
  return i;
}

CapturedValue summary_value(tp::TensorSummary s) {
  CapturedValue v;
  v.make_summary() = std::move(s);
  return v;
}

CapturedValue plain_value(c10::IValue iv, tp::ArgKind kind = tp::ArgKind::Generic) {
  CapturedValue v;
  v.kind = kind;
  v.set_plain(iv);
  return v;
}

CapturedValue json_value(Json j) {
  CapturedValue v;
  v.set_json(std::move(j));
  return v;
}

const std::string kAlpha = "alpha";
const std::string kDtype = "dtype";

// Records that exercise every form the writer knows, in an order that needs no sorting.
std::vector<tp::Record> sample_records() {
  using S = CapturedCall::Section;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<tp::Record> rs;

  auto call = std::make_shared<CapturedCall>();
  call->has_inputs = call->has_outputs = true;
  call->add(item(S::Arg, summary_value(summary(at::kFloat, {2, 3},
                                               {tp::StatValue::real(1.5), tp::StatValue::real(-0.0),
                                                tp::StatValue::real(1e-7), tp::StatValue::real(1e16)},
                                               true))));
  call->add(item(S::Arg, summary_value(summary(at::kLong, {},
                                               {tp::StatValue::integer(-7), tp::StatValue::integer(3),
                                                tp::StatValue::real(0.1), tp::StatValue()},
                                               false))));
  call->add(item(S::Arg, plain_value(c10::IValue())));
  call->add(item(S::Arg, plain_value(c10::IValue(true))));
  call->add(item(S::Arg, plain_value(c10::IValue(2.5))));
  call->add(item(S::Arg, plain_value(c10::IValue(std::string("s\"\xc3\xa9\n")))));
  call->add(item(S::Arg, plain_value(c10::IValue(std::vector<int64_t>{1, 2}))));
  call->add(item(S::Arg, plain_value(c10::IValue(std::vector<int64_t>{}))));
  call->add(item(S::Kwarg, plain_value(c10::IValue(int64_t{-3})), &kAlpha));
  call->add(item(S::Kwarg, plain_value(c10::IValue(int64_t{6}), tp::ArgKind::ScalarType), &kDtype));
  call->add(item(S::Output, summary_value(summary(at::kBool, {0},
                                                  {tp::StatValue::boolean(true), tp::StatValue::boolean(false),
                                                   tp::StatValue::real(nan), tp::StatValue::real(-inf)},
                                                  false))));
  call->add(item(S::Output, json_value(Json::parse(R"([{"a": [], "b": {}}, null, 1e300])"))));
  tp::Record a;
  a.name = "Aten.add.0.forward";
  a.order = 0;
  a.parent = std::string("Module.fc.Linear.forward.0");
  a.stack = std::make_shared<const tp::CallStack>();
  a.deferred = call;
  rs.push_back(std::move(a));

  // A body kept whole, and one with both parts (the compact part merged after the tree).
  tp::Record b;
  b.name = "Module.fc.Linear.forward.0";
  b.order = 1;
  b.parent = std::string();
  b.body = Json::parse(R"({"input_args": [{"type": "int", "value": 1}], "parameters": {"weight": null}})");
  rs.push_back(std::move(b));
  auto outputs_only = std::make_shared<CapturedCall>();
  outputs_only->has_outputs = true;
  tp::Record c;
  c.name = "Aten.mul.0.forward";
  c.order = 2;
  c.body = Json::parse(R"({"extra": 0.5})");
  c.deferred = outputs_only;
  rs.push_back(std::move(c));
  // A name committed twice: the later value in the first place; and an empty body.
  tp::Record d;
  d.name = "Aten.add.0.backward";
  d.order = 3;
  d.parent = std::string("Module.fc.Linear.backward.0");
  d.body = Json::parse(R"({"input": [1]})");
  rs.push_back(std::move(d));
  tp::Record e;
  e.name = "Aten.mul.0.backward";
  e.order = 4;
  e.body = Json::object();
  rs.push_back(std::move(e));
  tp::Record f;
  f.name = "Aten.add.0.backward";
  f.order = 5;
  f.body = Json::parse(R"({"input": [2]})");
  rs.push_back(std::move(f));
  return rs;
}

tp::StepDump dump_of(const std::vector<tp::Record>& rs) {
  tp::StepDump d;
  d.task = "statistics";
  d.level = "mix";
  d.directory = "unused";
  d.dump_data_dir = "/tmp/x\\y";
  for (const tp::Record& r : rs) d.records.push_back(&r);
  return d;
}

template <class Write>
std::string text_of(Write write, int indent = 1) {
  std::string buf;
  tp::io::JsonText out(buf, indent);
  write(out);
  out.finish();
  return buf;
}

TEST_CASE("a call's compact body gives back every value it was given, in order and by section") {
  using S = CapturedCall::Section;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CapturedCall call;
  const tp::TensorSummary five_dims = summary(at::kBFloat16, {2, 1, 3, 1, 70000},
                                              {tp::StatValue::real(3.5), tp::StatValue::real(-2.25),
                                               tp::StatValue::real(nan), tp::StatValue::integer(-(1LL << 40))},
                                              true);
  const tp::TensorSummary flags = summary(
      at::kBool, {},
      {tp::StatValue::boolean(true), tp::StatValue::boolean(false), tp::StatValue(), tp::StatValue::real(1.0)}, false);
  call.add(item(S::Arg, summary_value(five_dims)));
  call.add(item(S::Kwarg, plain_value(c10::IValue(int64_t{5}), tp::ArgKind::ScalarType), &kDtype));
  call.add(item(S::Arg, plain_value(c10::IValue(-0.0))));
  call.add(item(S::Arg, plain_value(c10::IValue(std::string("text")))));
  call.add(item(S::Output, summary_value(flags)));
  call.add(item(S::Output, json_value(Json::parse(R"({"k": [1, 2]})"))));
  call.add(item(S::Arg, plain_value(c10::IValue(false))));
  call.add(item(S::Arg, plain_value(c10::IValue())));

  std::vector<std::string> seen;
  auto same_summary = [](const tp::TensorSummary& a, const tp::TensorSummary& b) {
    auto same_stat = [](const tp::StatValue& x, const tp::StatValue& y) {
      if (x.kind != y.kind) return false;
      switch (x.kind) {
        case tp::StatValue::Kind::Float:
          return std::isnan(x.d) ? std::isnan(y.d) : x.d == y.d && std::signbit(x.d) == std::signbit(y.d);
        case tp::StatValue::Kind::Int: return x.i == y.i;
        case tp::StatValue::Kind::Bool: return x.b == y.b;
        case tp::StatValue::Kind::Null: return true;
      }
      return false;
    };
    return a.dtype == b.dtype && a.requires_grad == b.requires_grad &&
           std::vector<std::int64_t>(a.shape.begin(), a.shape.end()) ==
               std::vector<std::int64_t>(b.shape.begin(), b.shape.end()) &&
           same_stat(a.stats.max, b.stats.max) && same_stat(a.stats.min, b.stats.min) &&
           same_stat(a.stats.mean, b.stats.mean) && same_stat(a.stats.norm, b.stats.norm);
  };
  call.for_each([&](S section, const std::string* name, const CapturedValue& v) {
    const std::size_t k = seen.size();
    seen.push_back(std::to_string(static_cast<int>(section)));
    switch (k) {
      case 0: CHECK(same_summary(v.tensor(), five_dims)); break;
      case 1:
        CHECK(name == &kDtype);
        CHECK(v.kind == tp::ArgKind::ScalarType);
        CHECK(v.value().toInt() == 5);
        break;
      case 2: CHECK((v.value().isDouble() && std::signbit(v.value().toDouble()))); break;
      case 3: CHECK(v.value().toStringRef() == "text"); break;
      case 4: CHECK(same_summary(v.tensor(), flags)); break;
      case 5: CHECK(v.json() == Json::parse(R"({"k": [1, 2]})")); break;
      case 6: CHECK((v.value().isBool() && !v.value().toBool())); break;
      case 7: CHECK(v.value().isNone()); break;
      default: FAIL("an item too many");
    }
    if (k != 1) CHECK(name == nullptr);
  });
  CHECK((seen == std::vector<std::string>{"0", "1", "0", "0", "2", "2", "0", "0"}));
  std::size_t outputs = 0;
  call.for_each([&](S section, const std::string*, const CapturedValue&) { outputs += section == S::Output; },
                S::Output);
  CHECK(outputs == 2);
  // What the capture reserves for each value is what it takes.
  CHECK(CapturedCall::encoded_size(c10::IValue(torch::zeros({2, 1, 3, 1, 70000}, at::kBFloat16)), false) ==
        5 + 40 + 36);
  CHECK(CapturedCall::encoded_size(c10::IValue(int64_t{5}), true) == 2 + 8 + 1 + 8);
}

TEST_CASE("the step files written from the records are the bytes of the JSON trees") {
  const std::vector<tp::Record> rs = sample_records();
  const tp::StepDump d = dump_of(rs);
  const std::string dump = text_of([&](tp::io::JsonText& out) { tp::step_text::write_dump(out, d); });
  CHECK(dump == tp::io::to_python_json(d.dump_json()));
  CHECK(text_of([&](tp::io::JsonText& out) { tp::step_text::write_construct(out, d); }) ==
        tp::io::to_python_json(d.construct_json()));
  CHECK(text_of([&](tp::io::JsonText& out) { tp::step_text::write_stack(out, d); }) ==
        tp::io::to_python_json(d.stack_json()));
  SUBCASE("and python3's json.dump of what it reads gives the same bytes") {
    tptest::TempDir dir;
    { std::ofstream(dir / "dump.json", std::ios::binary) << dump; }
    const std::string out = tptest::run_python("import json,sys\ns=open('" + (dir / "dump.json") +
                                               "').read()\nd=json.loads(s)\n"
                                               "print(json.dumps(d, indent=1) == s, list(d['data'])[0], "
                                               "d['data']['Aten.add.0.backward']['input'])");
    // The later "Aten.add.0.backward" replaced the earlier one, in its place.
    CHECK(out == "True Aten.add.0.forward [2]\n");
  }

  SUBCASE("an empty step is written as Python writes empty containers") {
    const tp::StepDump empty = dump_of({});
    CHECK(text_of([&](tp::io::JsonText& out) { tp::step_text::write_dump(out, empty); }) ==
          tp::io::to_python_json(empty.dump_json()));
    CHECK(text_of([&](tp::io::JsonText& out) { tp::step_text::write_construct(out, empty); }) == "{}");
    CHECK(text_of([&](tp::io::JsonText& out) { tp::step_text::write_stack(out, empty); }) == "{}");
  }
}

TEST_CASE("a body written on one line is what the journal's tree path wrote") {
  const std::vector<tp::Record> rs = sample_records();
  for (const tp::Record& r : rs) {
    CAPTURE(r.name);
    CHECK(text_of([&](tp::io::JsonText& out) { tp::io::write_record_body(out, r, 0); }, -1) ==
          tp::io::to_python_json(r.json_body(), -1));
  }
}

TEST_CASE("the directory sink writes dump.json in chunks, and the whole file is the document") {
  // Enough entries to pass the 1 MiB chunk several times.
  std::vector<tp::Record> rs;
  for (int i = 0; i < 10000; ++i) {
    auto call = std::make_shared<CapturedCall>();
    call->has_inputs = true;
    call->add(item(CapturedCall::Section::Arg,
                   summary_value(summary(at::kFloat, {16},
                                         {tp::StatValue::real(i), tp::StatValue::real(-i / 3.0),
                                          tp::StatValue::real(i * 1e-9), tp::StatValue::real(i * 7.25)},
                                         false))));
    tp::Record r;
    r.name = "Aten.add." + std::to_string(i) + ".forward";
    r.order = static_cast<std::uint64_t>(i);
    r.parent = std::string();
    r.deferred = call;
    rs.push_back(std::move(r));
  }
  tptest::TempDir dir;
  tp::StepDump d = dump_of(rs);
  d.directory = dir.path();
  d.extra_info = true;
  tp::DirectorySink sink;
  sink.write_step(d);
  std::ifstream in(dir / "dump.json", std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(file.size() > (std::size_t{2} << 20));
  CHECK(file == tp::io::to_python_json(d.dump_json()));
  std::ifstream cin(dir / "construct.json", std::ios::binary);
  const std::string construct((std::istreambuf_iterator<char>(cin)), std::istreambuf_iterator<char>());
  CHECK(construct == tp::io::to_python_json(d.construct_json()));
}

// Issue 45: each entry's text is made once, by the journal's thread; dump.json and debug.json are
// that text laid out again. They must be the bytes the records give (MemorySink's trees, written as
// Python writes them), also where module entries come after the calls they enclose in the journal.
struct TwoLayers : torch::nn::Module {
  TwoLayers()
      : fc1(register_module("fc1", torch::nn::Linear(4, 3))), fc2(register_module("fc2", torch::nn::Linear(3, 2))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};

// Returns the step's directory.
template <class D>
std::string one_step(D& d, const std::shared_ptr<TwoLayers>& model, const torch::Tensor& x) {
  model->zero_grad();  // each run sees the same gradients
  d.start(*model);
  const std::string where = d.directory();
  const torch::Tensor y = model->forward(x);
  d.save(y, "y");
  y.sum().backward();
  d.stop();
  d.step();
  return where;
}

TEST_CASE("dump.json and debug.json are laid out from the journal's lines, in the bytes the records give") {
  torch::manual_seed(7);
  auto model = std::make_shared<TwoLayers>();
  const torch::Tensor x = torch::randn({5, 4});
  tptest::TempDir dir;
  tp::Debugger<tp::Level::Mix, tp::Task::Statistics, tp::MemorySink> memory(tp::Options().dump_path(dir / "m"));
  one_step(memory, model, x);
  const tp::MemorySink::Files& want = memory.sink().step(0);
  REQUIRE(want.dump["data"].size() > 8);  // modules and calls, forward and backward

  tp::Debugger<tp::Level::Mix, tp::Task::Statistics> directory(tp::Options().dump_path(dir / "d"));
  SUBCASE("from the journal") {
    const std::string rank = one_step(directory, model, x);
    directory.wait_written();
    CHECK(tptest::read_text(rank + "/dump.json") == tp::io::to_python_json(want.dump));
    CHECK(tptest::read_text(rank + "/debug.json") == tp::io::to_python_json(want.debug));
    CHECK(tptest::read_text(rank + "/construct.json") == tp::io::to_python_json(want.construct));
    CHECK(directory.sink().sources().journal == 2);  // dump.json and debug.json
    CHECK(directory.sink().sources().records == 0);
  }
  SUBCASE("from the records when the journal is gone before the step is written") {
    directory.background_writer().pause();
    const std::string rank = one_step(directory, model, x);
    REQUIRE(std::filesystem::remove(rank + "/journal.jsonl"));
    directory.background_writer().resume();
    directory.wait_written();
    CHECK(tptest::read_text(rank + "/dump.json") == tp::io::to_python_json(want.dump));
    CHECK(tptest::read_text(rank + "/debug.json") == tp::io::to_python_json(want.debug));
    CHECK(directory.sink().sources().journal == 0);
    CHECK(directory.sink().sources().records == 2);
  }
}

// A module whose calls fill more than the writer's 1 MiB window of the journal: the modules' lines
// come after all of them in the file and first in dump.json, so the writer reads them apart.
struct ManyAdds : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) {
    for (int i = 0; i < 4000; ++i) x = x + 1;
    return x;
  }
};
struct Outer : torch::nn::Module {
  Outer() : inner(register_module("inner", std::make_shared<ManyAdds>())) {}
  torch::Tensor forward(const torch::Tensor& x) { return inner->forward(x) * 2; }
  std::shared_ptr<ManyAdds> inner;
};

TEST_CASE("a step whose journal is larger than the writer's window is laid out in the records' bytes") {
  auto model = std::make_shared<Outer>();
  const torch::Tensor x = torch::ones({3});
  tptest::TempDir dir;
  tp::Debugger<tp::Level::Mix, tp::Task::Statistics, tp::MemorySink> memory(tp::Options().dump_path(dir / "m"));
  tp::Debugger<tp::Level::Mix, tp::Task::Statistics> directory(tp::Options().dump_path(dir / "d"));
  memory.start(*model);
  model->forward(x);
  memory.stop();
  directory.start(*model);
  const std::string rank = directory.directory();
  model->forward(x);
  directory.stop();
  directory.wait_written();
  const std::string want = tp::io::to_python_json(memory.sink().step(0).dump);
  CHECK(want.size() > (std::size_t{2} << 20));
  CHECK(tptest::read_text(rank + "/journal.jsonl").size() > (std::size_t{3} << 19));  // past 1.5 MiB
  CHECK(tptest::read_text(rank + "/dump.json") == want);
  CHECK(directory.sink().sources().journal == 1);
  directory.step();
}

}  // namespace tp_step_text_test
