// Configuration rejections and warnings not covered in config_test.cpp: documents and files that are
// not JSON objects, files that cannot be opened, msprobe's 1e6 bound on step/rank lists, overflow_nums
// beyond int64, non-string level/risk_level/precision, NUL characters in paths, and the check_mode and
// debug-scope warnings.
#include <doctest/doctest.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "../skip.hpp"
#include "torchprobe/config/config.hpp"
#include "torchprobe/config/options.hpp"
#include "forked_child.hpp"
#include "config_support.hpp"

using nlohmann::json;
using namespace torchprobe;

namespace {

using tptest::doc_with;
using tptest::rejection;

template <class F>
std::string rejection_of(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(accepted)";
}

void check_mentions(const std::string& message, std::initializer_list<std::string> parts) {
  INFO("message: " << message);
  for (const std::string& part : parts) CHECK(message.find(part) != std::string::npos);
}

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("torchprobe_rejections_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name, std::ios::binary) << text;
    return (path / name).string();
  }
  std::set<std::string> entries() const {
    std::set<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path)) out.insert(e.path().filename().string());
    return out;
  }
};

const std::string kNul("a\0b", 3);  // the std::string of JSON "a\u0000b"

}  // namespace

// ---- documents and files that are not JSON objects ----

TEST_CASE("a document that is not a JSON object is rejected, showing what it is") {
  CHECK(rejection(json::array({1, 2})) == "a configuration must be a JSON object, not [1,2]");
  CHECK(rejection(json("./dump")) == "a configuration must be a JSON object, not \"./dump\"");
  CHECK(rejection(json(nullptr)) == "a configuration must be a JSON object, not null");
}

TEST_CASE("a config file holding valid JSON that is not an object is rejected with its path and content") {
  TempDir dir;
  const std::string list = dir.write("list.json", "[1, 2]");
  const std::string text = dir.write("text.json", "\"./dump\"");
  CHECK(rejection_of([&] { load_config_file(list); }) ==
        "config file \"" + list + "\" should hold a JSON object, not [1,2]");
  CHECK(rejection_of([&] { load_config_file(text); }) ==
        "config file \"" + text + "\" should hold a JSON object, not \"./dump\"");
  // Options reads the file the same way.
  CHECK(rejection_of([&] { Options().config_file(list).resolve(); }) ==
        "config file \"" + list + "\" should hold a JSON object, not [1,2]");
}

TEST_CASE("an empty config file is reported as invalid JSON with its path") {
  TempDir dir;
  const std::string path = dir.write("empty.json", "");
  check_mentions(rejection_of([&] { load_config_file(path); }), {"config file \"" + path + "\"", "not valid JSON"});
}

TEST_CASE("a config file that exists but cannot be opened is reported with its path and the reason") {
  // open(2) refuses a UNIX socket with ENXIO, even for root, for whom permission bits do not count.
  TempDir dir;
  const std::string path = (dir.path / "config.sock").string();
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  REQUIRE(path.size() < sizeof addr.sun_path);
  std::strcpy(addr.sun_path, path.c_str());
  REQUIRE(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0);
  const std::string message = rejection_of([&] { load_config_file(path); });
  ::close(fd);
  CHECK(message == "config file \"" + path + "\" cannot be read: " + std::strerror(ENXIO));
}

TEST_CASE("a config file without read permission is reported with its path and the reason") {
  TempDir dir;
  const std::string path = dir.write("config.json", R"({"dump_path": "./d"})");
  REQUIRE(::chmod(path.c_str(), 0) == 0);
  // Root may read any file: the check runs in a child that has dropped to nobody.
  const tptest::ChildResult r = tptest::in_child([&](std::string& text) {
    if (!tptest::drop_root()) {
      text = "cannot drop root";
      return 2;
    }
    text = rejection_of([&] { load_config_file(path); });
    return 0;
  });
  REQUIRE_MESSAGE(r.code == 0, r.text);
  CHECK(r.text == "config file \"" + path + "\" cannot be read: " + std::strerror(EACCES));
}

// ---- msprobe's bound on the length of step and rank lists ----

TEST_CASE("a step or rank list of more than 1000000 elements is rejected, as msprobe bounds its length") {
  const json too_long(std::size_t{1000001}, 7);
  for (const char* key : {"step", "rank"}) {
    CAPTURE(key);
    const std::string message = rejection(doc_with({{key, too_long}}));
    check_mentions(message, {std::string("config key \"") + key + "\": [7,7,7,", "it has more than 1000000 elements",
                             "(allowed: a list of integers or \"a-b\" ranges with 0 <= a <= b <= 1000000)"});
    CHECK(message.size() < 400);  // the value is shown cut short, not a million times
  }
  // The bound is on the list, not on the steps it names: msprobe takes both of these.
  CHECK(parse_config(doc_with({{"step", json(std::size_t{1000000}, 7)}})).step.values() == std::vector<int64_t>{7});
  CHECK(parse_config(doc_with({{"rank", {"0-1000000"}}})).rank.values().size() == 1000001);
}

// ---- overflow_nums beyond int64 ----

TEST_CASE("overflow_nums beyond int64 is rejected naming the key, the value and what is allowed") {
  auto overflow = [](const std::string& n) {
    return json::parse(R"({"dump_path": "./d", "task": "overflow_check", "overflow_check": {"overflow_nums": )" + n +
                       "}}");
  };
  const std::string allowed = "(allowed: -1 (no limit) or an integer greater than 0)";
  CHECK(rejection(overflow("9223372036854775808")) ==
        "config key \"overflow_check.overflow_nums\": 9223372036854775808 is invalid: it is too large " + allowed);
  CHECK(rejection(overflow("18446744073709551615")) ==
        "config key \"overflow_check.overflow_nums\": 18446744073709551615 is invalid: it is too large " + allowed);
  // Past uint64 (or below int64) JSON numbers become floating point: not an integer any more.
  check_mentions(rejection(overflow("100000000000000000000")),
                 {"\"overflow_check.overflow_nums\"", "1e+20", "it should be an integer", allowed});
  check_mentions(rejection(overflow("-9223372036854775809")),
                 {"\"overflow_check.overflow_nums\"", "-9.223372036854776e+18", "it should be an integer", allowed});
  CHECK(parse_config(overflow("9223372036854775807")).overflow_nums == std::numeric_limits<int64_t>::max());
}

// ---- non-string choices ----

TEST_CASE("a level, risk_level or precision that is not a string is rejected with the allowed strings") {
  CHECK(rejection(doc_with({{"level", 1}})) ==
        "config key \"level\": 1 is invalid: it should be a string (allowed: \"L0\", \"L1\", \"mix\", \"L2\", "
        "\"debug\")");
  CHECK(rejection(doc_with({{"level", {"L1"}}})) ==
        "config key \"level\": [\"L1\"] is invalid: it should be a string (allowed: \"L0\", \"L1\", \"mix\", \"L2\", "
        "\"debug\")");
  CHECK(rejection(doc_with({{"risk_level", true}})) ==
        "config key \"risk_level\": true is invalid: it should be a string (allowed: \"ALL\", \"FOCUS\", \"CORE\")");
  CHECK(rejection(doc_with({{"precision", 0.5}})) ==
        "config key \"precision\": 0.5 is invalid: it should be a string (allowed: \"low\", \"high\")");
  CHECK(rejection(doc_with({{"precision", {{"value", "low"}}}})) ==
        "config key \"precision\": {\"value\":\"low\"} is invalid: it should be a string (allowed: \"low\", \"high\")");
  // Options::set reaches the same check.
  CHECK(rejection_of([] { Options().set("risk_level", 2).resolve(); }) ==
        "config key \"risk_level\": 2 is invalid: it should be a string (allowed: \"ALL\", \"FOCUS\", \"CORE\")");
}

// ---- NUL characters in paths ----

TEST_CASE("a dump_path with a NUL character is rejected, not cut short at the NUL") {
  const std::string expected =
      "config key \"dump_path\": \"a\\u0000b\" is invalid: it contains a NUL character "
      "(allowed: a non-empty string without NUL characters naming the dump directory)";
  CHECK(rejection({{"dump_path", kNul}}) == expected);
  CHECK(rejection_of([] { Options().dump_path(kNul).resolve(); }) == expected);
  check_mentions(rejection({{"dump_path", std::string("\0", 1)}}), {"\"dump_path\"", "\"\\u0000\"", "NUL"});
  check_mentions(rejection({{"dump_path", std::string("dump\0", 5)}}), {"\"dump_path\"", "\"dump\\u0000\"", "NUL"});

  TempDir dir;
  const std::string path = dir.write("config.json", R"({"dump_path": "a\u0000b"})");
  CHECK(rejection_of([&] { load_config_file(path); }) == "config file \"" + path + "\": " + expected);
  CHECK(rejection_of([&] { Options().config_file(path).resolve(); }) == expected);
  CHECK(dir.entries() == std::set<std::string>{"config.json"});  // nothing named "a" appeared
}

TEST_CASE("a config file path with a NUL character is rejected, not read from the text before it") {
  TempDir dir;
  const std::string good = dir.write("c", R"({"dump_path": "./d"})");
  const std::string bad = good + std::string("\0.json", 6);  // open() would read `good`
  const std::string expected = "config file \"" + good + "\\u0000.json\" is invalid: its path contains a NUL character";
  CHECK(rejection_of([&] { load_config_file(bad); }) == expected);
  CHECK(rejection_of([&] { Options().config_file(bad).resolve(); }) == expected);
}

// ---- warnings ----

TEST_CASE("check_mode is accepted with a warning that msprobe uses it only for MindSpore") {
  const Config c = parse_config(
      doc_with({{"task", "overflow_check"}, {"overflow_check", {{"overflow_nums", 3}, {"check_mode", "all"}}}}));
  CHECK(c.overflow_nums == 3);
  CHECK(c.warnings == std::vector<std::string>{
                          "config key \"overflow_check.check_mode\" is ignored: msprobe uses it only for MindSpore"});
  const Config s = parse_config(doc_with({{"statistics", {{"check_mode", "aicore"}}}}));
  CHECK(s.warnings == std::vector<std::string>{
                          "config key \"statistics.check_mode\" is ignored: msprobe uses it only for MindSpore"});
}

TEST_CASE("scope and list at level debug are accepted unchecked, with a warning that save() ignores them") {
  const std::string warning =
      "config keys \"statistics.scope\"/\"statistics.list\" are ignored at level \"debug\": save() writes every value "
      "it "
      "is given";
  // Not a [start, end] pair of API names: at level debug the scope is not checked at all.
  const Config scoped = parse_config(doc_with({{"level", "debug"}, {"statistics", {{"scope", {"x"}}}}}));
  CHECK(scoped.scope == std::vector<std::string>{"x"});
  CHECK(scoped.warnings == std::vector<std::string>{warning});
  const Config listed = parse_config(doc_with({{"level", "debug"}, {"statistics", {{"list", {"relu"}}}}}));
  CHECK(listed.warnings == std::vector<std::string>{warning});
  const Config tensor =
      parse_config(doc_with({{"level", "debug"}, {"task", "tensor"}, {"tensor", {{"list", {"relu"}}}}}));
  CHECK(tensor.warnings ==
        std::vector<std::string>{"config keys \"tensor.scope\"/\"tensor.list\" are ignored at level \"debug\": save() "
                                 "writes every value it is given"});
  CHECK(parse_config(doc_with({{"level", "debug"}})).warnings.empty());
}

// ---- configs copied from msprobe (issue 44, item 8) ----

TEST_CASE("an L2 list with msprobe's Python name is answered with a warning that says how the ATen name reads") {
  const Config c = parse_config(
      doc_with({{"task", "tensor"}, {"level", "L2"}, {"tensor", {{"list", {"Functional.linear.0.backward"}}}}}));
  CHECK(c.list == std::vector<std::string>{"Functional.linear.0.backward"});  // kept: the run is the user's to change
  REQUIRE(c.warnings.size() == 1);
  CHECK(c.warnings[0].rfind("config key \"tensor.list\": \"Functional.linear.0.backward\" is a name of msprobe's "
                            "Python APIs, which a libtorch program does not call, so it selects nothing; TorchProbe "
                            "names calls by ATen operator, here \"Aten.linear.0.backward\"",
                            0) == 0);
  // The same for L1 lists and scopes; an ATen name, or a bare substring such as "relu", is no Python name.
  const Config l1 = parse_config(
      doc_with({{"statistics",
                 {{"scope", {"Torch.matmul.0.forward", "Aten.relu.0.forward"}}, {"list", {"relu", "Tensor.add_"}}}}}));
  REQUIRE(l1.warnings.size() == 2);
  CHECK(l1.warnings[0].find("\"statistics.scope\": \"Torch.matmul.0.forward\"") != std::string::npos);
  CHECK(l1.warnings[0].find("here \"Aten.matmul.0.forward\"") != std::string::npos);
  CHECK(l1.warnings[1].find("\"statistics.list\": \"Tensor.add_\"") != std::string::npos);
  CHECK(parse_config(doc_with({{"statistics", {{"list", {"Aten.linear.0.forward", "relu"}}}}})).warnings.empty());
}

TEST_CASE("file_format is answered as MindSpore's, online_run_ut as msprobe's online mode, not as unknown keys") {
  const Config f = parse_config(doc_with({{"task", "tensor"}, {"tensor", {{"file_format", "npy"}}}}));
  CHECK(f.warnings ==
        std::vector<std::string>{"config key \"tensor.file_format\" is ignored: msprobe uses it only for MindSpore"});
  const Config on = parse_config(doc_with({{"task", "tensor"}, {"tensor", {{"online_run_ut", true}}}}));
  REQUIRE(on.warnings.size() == 1);
  CHECK(on.warnings[0].rfind("config key \"tensor.online_run_ut\" is ignored: it switches on msprobe's online run_ut",
                             0) == 0);
  CHECK(on.warnings[0].find("torchprobe run_ut -api_info DUMP.json") != std::string::npos);
  // msprobe's shipped config has it switched off: nothing to say then.
  CHECK(parse_config(doc_with({{"task", "tensor"}, {"tensor", {{"online_run_ut", false}}}})).warnings.empty());
}
