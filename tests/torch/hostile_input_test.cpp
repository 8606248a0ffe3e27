// Files from others that would make the tools read outside the dump, or allocate what a size field
// claims (issue 46): refused, with the file, the byte offset or the entry, and what was expected.
// The fuzz targets (tests/fuzz) look for what these hand-made cases do not think of.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <zlib.h>

#include "torchprobe/analysis/compare/cli.hpp"
#include "torchprobe/analysis/compare/tensor_metrics.hpp"
#include "torchprobe/analysis/run_ut/inputs.hpp"
#include "torchprobe/io/pickle_scan.hpp"
#include "torchprobe/io/pt_archive.hpp"
#include "torchprobe/io/pt_reader.hpp"
#include "test_support.hpp"

namespace hostile_input_test {

namespace tp = torchprobe;
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

std::vector<char> pt_bytes(const at::Tensor& t) { return torch::pickle_save(t); }
void write(const fs::path& f, const std::vector<char>& b) {
  std::ofstream(f, std::ios::binary).write(b.data(), static_cast<std::streamsize>(b.size()));
}
std::string problem(const std::vector<char>& b) {
  return tp::io::pt_archive_problem(std::string_view(b.data(), b.size())).value_or("");
}
void put32(std::vector<char>& b, std::size_t at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xFF);
}
std::uint32_t get32(const std::vector<char>& b, std::size_t at) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + static_cast<std::size_t>(i)]);
  return v;
}
// Where the first entry of the zip directory starts.
std::size_t first_directory_entry(const std::vector<char>& b) {
  const std::string_view s(b.data(), b.size());
  const std::size_t at = s.find(std::string_view("PK\x01\x02", 4));
  REQUIRE(at != std::string_view::npos);
  return at;
}

Json tensor_arg(const std::string& data_name) {
  return Json{{"type", "torch.Tensor"}, {"dtype", "torch.float32"}, {"shape", {3}}, {"Max", 2.0}, {"Min", 0.0},
              {"requires_grad", false}, {"data_name", data_name}};
}

TEST_CASE("run_ut reads a data_name inside dump_tensor_data and refuses one with a directory part, never reading it") {
  tptest::TempDir tmp;
  const fs::path data = fs::path(tmp.path()) / "dump" / "dump_tensor_data";
  fs::create_directories(data / "sub");
  write(data / "Torch.add.0.forward.input.0.pt", pt_bytes(at::arange(3, at::kFloat)));
  write(data / "sub" / "inner.pt", pt_bytes(at::full({3}, 7.0)));
  write(fs::path(tmp.path()) / "dump" / "secret.pt", pt_bytes(at::full({3}, 42.0)));
  tp::run_ut::InputBuilder build(data.string(), "Torch.add.0");

  const tp::run_ut::Arg ok = build.build(tensor_arg("Torch.add.0.forward.input.0.pt"));
  CHECK(ok.value.toTensor().equal(at::arange(3, at::kFloat)));
  for (const std::string& name : {std::string("../secret.pt"), (fs::path(tmp.path()) / "dump" / "secret.pt").string(),
                                  std::string("sub/inner.pt"), std::string("sub/../../secret.pt"), std::string(".."),
                                  std::string("..\\secret.pt"), std::string()}) {
    CAPTURE(name);
    CHECK_THROWS_WITH_AS(build.build(tensor_arg(name)),
                         doctest::Contains(("data_name \"" + name + "\" is not a file in " + data.string()).c_str()),
                         tp::run_ut::RunUtError);
  }
}

TEST_CASE("run_ut refuses a statistics entry whose shape takes more bytes than allowed, before allocating it") {
  tp::run_ut::InputBuilder build("", "Torch.add.0");
  build.set_max_tensor_bytes(24);
  const auto spec = [](Json shape) {
    return Json{{"type", "torch.Tensor"}, {"dtype", "torch.float32"}, {"shape", shape}, {"Max", 2.0}, {"Min", 0.0}};
  };
  const at::Tensor t = build.build(spec({2, 3})).value.toTensor();  // 24 bytes: the most allowed
  CHECK(t.sizes() == at::IntArrayRef({2, 3}));
  CHECK_THROWS_WITH_AS(build.build(spec({2, 4})), doctest::Contains("needs more than 24 bytes"),
                       tp::run_ut::RunUtError);
  CHECK_THROWS_WITH_AS(build.build(spec({std::int64_t(1) << 40})), doctest::Contains("needs more than 24 bytes"),
                       tp::run_ut::RunUtError);
  // Sizes whose product overflows int64 when multiplied as they stand.
  CHECK_THROWS_WITH_AS(build.build(spec({std::int64_t(1) << 32, std::int64_t(1) << 32, 16})),
                       doctest::Contains("needs more than"), tp::run_ut::RunUtError);
  CHECK_THROWS_WITH_AS(build.build(spec({3, -1})), doctest::Contains("shape [3, -1] has a negative size"),
                       tp::run_ut::RunUtError);
  CHECK_THROWS_WITH_AS(build.build(spec(Json(std::vector<int>(65, 1)))), doctest::Contains("more than 64 dimensions"),
                       tp::run_ut::RunUtError);
  // By default the limit is the machine's memory: a terabyte-sized claim is refused all the same.
  tp::run_ut::InputBuilder plain("", "Torch.add.0");
  CHECK_THROWS_AS(plain.build(spec({std::int64_t(1) << 40})), tp::run_ut::RunUtError);
}

TEST_CASE("run_ut takes an integer of the dump only when it fits int64, and keeps integer tensors in their dtype") {
  tp::run_ut::InputBuilder build("", "Torch.add.0");
  const auto arg = [](const char* type, Json value) { return Json{{"type", type}, {"value", value}}; };
  // 3, 3.0 and 2^62 written as a float are integers; 2.5, 1e30 and 2^63 are not (found by the fuzzer:
  // nlohmann's get<int64_t>() converted 1e30 with undefined behaviour).
  CHECK(build.build(arg("int", 3)).value.toInt() == 3);
  CHECK(build.build(arg("int", 3.0)).value.toInt() == 3);
  CHECK(build.build(arg("int", 4611686018427387904.0)).value.toInt() == (std::int64_t(1) << 62));
  for (const Json& bad : {Json(2.5), Json(1e30), Json(9223372036854775808.0), Json(18446744073709551615u), Json("3")}) {
    CAPTURE(bad.dump());
    CHECK_THROWS_WITH_AS(build.build(arg("int", bad)), doctest::Contains(("\"value\" is " + bad.dump()).c_str()),
                         tp::run_ut::RunUtError);
  }
  CHECK_THROWS_WITH_AS(build.build(arg("torch.Size", Json{2, 1e30})), doctest::Contains("is 1e+30: not an integer"),
                       tp::run_ut::RunUtError);
  const auto tensor = [](const char* dtype, Json shape, Json lo, Json hi) {
    return Json{{"type", "torch.Tensor"}, {"dtype", dtype}, {"shape", shape}, {"Max", hi}, {"Min", lo}};
  };
  CHECK_THROWS_WITH_AS(build.build(tensor("torch.float32", {2, 1e30}, 0, 1)),
                       doctest::Contains("\"shape\" is 1e+30: not an integer"), tp::run_ut::RunUtError);
  // Bounds past the dtype are the dtype's bounds (an int64 Max written as a float rounds past it).
  const at::Tensor i8 = build.build(tensor("torch.int8", {1000}, -1e30, 1e30)).value.toTensor();
  CHECK((i8.scalar_type() == at::kChar));
  CHECK(i8.view(-1)[0].item<int>() == -128);
  CHECK(i8.view(-1)[-1].item<int>() == 127);
  CHECK(i8.min().item<int>() == -128);
  CHECK(i8.max().item<int>() == 127);
  const at::Tensor i64 =
      build.build(tensor("torch.int64", {50}, -5, 9223372036854775807.0)).value.toTensor();  // reads as 2^63
  CHECK(i64.view(-1)[0].item<std::int64_t>() == -5);
  CHECK(i64.view(-1)[-1].item<std::int64_t>() == std::numeric_limits<std::int64_t>::max());
  CHECK(i64.min().item<std::int64_t>() == -5);
  const at::Tensor same = build.build(tensor("torch.int32", {4}, 7, 7)).value.toTensor();
  CHECK(same.equal(at::full({4}, 7, at::kInt)));
  const at::Tensor u8 = build.build(tensor("torch.uint8", {300}, 3, 9)).value.toTensor();
  CHECK(u8.min().item<int>() == 3);
  CHECK(u8.max().item<int>() == 9);
  // Infinite bounds give no integer range at all; Min above Max is named.
  const Json inf = tp::compare::parse_json_text(R"({"Min": -Infinity, "Max": 3})");
  CHECK_THROWS_WITH_AS(build.build(tensor("torch.int64", {2}, inf["Min"], inf["Max"])),
                       doctest::Contains("an integer tensor's bounds must be finite"), tp::run_ut::RunUtError);
  CHECK_THROWS_WITH_AS(build.build(tensor("torch.int64", {2}, 5, 4)), doctest::Contains("Min 5 is above Max 4"),
                       tp::run_ut::RunUtError);
}

TEST_CASE(
    "a .pt file whose zip directory claims more than the file holds is refused with the byte offset, before "
    "libtorch reads it") {
  const std::vector<char> good = pt_bytes(at::arange(5, at::kDouble));
  CHECK(problem(good).empty());
  const std::size_t entry = first_directory_entry(good);

  std::vector<char> big = good;  // the first record claims 2 GiB, stored
  put32(big, entry + 20, 0x7FFFFFFF);
  put32(big, entry + 24, 0x7FFFFFFF);
  CHECK(problem(big).rfind("at byte ", 0) == 0);
  CHECK(problem(big).find("claims 2147483647 bytes, past the start of the directory") != std::string::npos);

  std::vector<char> unpacked = good;  // stored, yet the sizes differ
  put32(unpacked, entry + 24, 1000000);
  CHECK(problem(unpacked) == "at byte " + std::to_string(entry) + ": record 0 claims 1000000 bytes from " +
                                 std::to_string(get32(good, entry + 20)) + " stored (method 0)");

  std::vector<char> moved = good;  // the first record's local header placed past the directory
  put32(moved, entry + 42, static_cast<std::uint32_t>(good.size()));
  CHECK(problem(moved).find("where no record starts") != std::string::npos);

  std::vector<char> many = good;  // the zip64 end record claims 65000 records (torch.save writes zip64)
  const std::size_t eocd = good.size() - 22;
  REQUIRE(std::memcmp(good.data() + eocd, "PK\x05\x06", 4) == 0);
  REQUIRE(std::memcmp(good.data() + eocd - 20, "PK\x06\x07", 4) == 0);
  const std::size_t zip64 = get32(good, eocd - 20 + 8);
  for (const std::size_t count_at : {zip64 + 24, zip64 + 32}) {
    put32(many, count_at, 65000);
    put32(many, count_at + 4, 0);
  }
  CHECK(problem(many).find("claims 65000 records, more than its") != std::string::npos);

  // libtorch allocates what a deflated record claims before inflating it: 4 GB for a 1 KB file.
  std::vector<char> deflated = good;
  deflated[entry + 10] = 8;
  put32(deflated, entry + 24, 0xF0000000);
  CHECK(problem(deflated).find("record 0 claims 4026531840 bytes from") != std::string::npos);
  CHECK(problem(deflated).find("(method 8)") != std::string::npos);

  // libtorch's reader leaks when its constructor throws: what it checks there is checked first.
  std::vector<char> no_version = good;
  for (std::size_t at = 0; (at = std::string_view(no_version.data(), no_version.size()).find("archive/version", at)) !=
                           std::string_view::npos;)
    no_version[at + 14] = 'X';
  CHECK(problem(no_version).find("no stored version record (\"archive/version\")") != std::string::npos);
  std::vector<char> commented = good;  // the end record's comment length says 5, none follows
  commented[good.size() - 2] = 5;
  CHECK(problem(commented).find("says its comment is 5 bytes, where 0 follow") != std::string::npos);

  const std::vector<char> cut(good.begin(), good.end() - 10);
  CHECK(problem(cut) == "no zip directory at the end of the file (truncated?)");
  CHECK(problem(std::vector<char>{'{', '}'}).rfind("not a zip archive", 0) == 0);

  tptest::TempDir tmp;
  const fs::path file = fs::path(tmp.path()) / "x.pt";
  write(file, big);
  CHECK_THROWS_WITH_AS(tp::io::read_pt_file(file),
                       doctest::Contains((file.string() + ": not a readable .pt file: at byte ").c_str()),
                       tp::io::PtFileError);
  // A version this libtorch does not read: refused by TorchProbe, before libtorch's reader.
  std::vector<char> future = good;
  const std::string_view text(future.data(), future.size());
  const std::size_t local = text.find("archive/version");  // the first: its local header; the bytes follow
  REQUIRE(local != std::string_view::npos);
  const std::size_t header = local - 30, data = local + 15 + get32(future, header + 28) % 65536;
  REQUIRE(text.substr(data, 2) == "3\n");
  future[data] = '9';
  future[data + 1] = '9';
  // Its CRC-32 made right, in the local and the central header: only the number is wrong.
  const auto crc = static_cast<std::uint32_t>(::crc32(0L, reinterpret_cast<const Bytef*>("99"), 2));
  if (get32(future, header + 14) != 0) put32(future, header + 14, crc);  // 0: kept in a data descriptor
  std::size_t central = std::string_view::npos;
  for (std::size_t at = local + 1; (at = text.find("archive/version", at)) != std::string_view::npos; ++at)
    if (at >= 46 && text.substr(at - 46, 4) == std::string_view("PK\x01\x02", 4)) central = at - 46;
  REQUIRE(central != std::string_view::npos);
  put32(future, central + 16, crc);
  write(file, future);
  CHECK_THROWS_WITH_AS(tp::io::read_pt_file(file), doctest::Contains("its version record says \"99\""),
                       tp::io::PtFileError);
  write(file, good);
  CHECK(tp::io::read_pt_file(file).toTensor().equal(at::arange(5, at::kDouble)));
}

TEST_CASE("the pickle of a .pt file is walked first: a length or memo index larger than the pickle is refused") {
  using tp::io::pickle_problem;
  const auto pk = [](std::initializer_list<int> bytes) {
    std::string s;
    for (const int b : bytes) s += static_cast<char>(b);
    return s;
  };
  // PROTO 2, EMPTY_LIST, BINPUT 0, BINUNICODE "abc", STOP: what a writer makes.
  CHECK_FALSE(pickle_problem(pk({0x80, 2, ']', 'q', 0, 'X', 3, 0, 0, 0, 'a', 'b', 'c', '.'})).has_value());
  // libtorch's Unpickler reserves the claimed 2 GB before it reads: refused.
  CHECK(pickle_problem(pk({0x80, 2, 'X', 0xFF, 0xFF, 0xFF, 0x7F, 'a', 'b', 'c', '.'})).value_or("") ==
        "data.pkl byte 2: a value claims 2147483647 bytes, 4 follow");
  CHECK(pickle_problem(pk({0x80, 2, 0x8d, 0, 0, 0, 0, 0, 0, 0, 0x40, '.'}))
            .value_or("")
            .find("claims 4611686018427387904 bytes") != std::string::npos);
  // LONG_BINPUT 0xF0000000 would grow libtorch's memo table to 4 billion entries (64 GB).
  CHECK(pickle_problem(pk({0x80, 2, ']', 'r', 0, 0, 0, 0xF0, '.'})).value_or("") ==
        "data.pkl byte 3: memo index 4026531840 skips ahead of the 0 entries made so far");
  CHECK(pickle_problem(pk({0x80, 2, ']', 'q', 0, ']', 'q', 1, '.'})).value_or("x") == "x");
  CHECK(pickle_problem(pk({0x80, 2, ']', 'q', 0, ']', 'q', 2, '.'})).value_or("").find("memo index 2 skips ahead") !=
        std::string::npos);
  CHECK(pickle_problem(pk({0x80, 2, ']'})).value_or("") == "data.pkl byte 3: the pickle has no STOP opcode");
  // libtorch pops without looking: BUILD on a stack of one made it free what it never allocated.
  CHECK(pickle_problem(pk({0x80, 2, 'N', 'b', '.'})).value_or("") ==
        "data.pkl byte 3: an opcode takes 2 values where the stack holds 1");
  CHECK(pickle_problem(pk({0x80, 2, 'N', 't', '.'})).value_or("").find("with no MARK open") != std::string::npos);
  CHECK(pickle_problem(pk({0x80, 2, 'N', '(', '0', '.'})).value_or("").find("takes 1 values where the stack holds 0") !=
        std::string::npos);
  CHECK(pickle_problem(pk({0x80, 2, '.'})).value_or("").find("STOP with an empty stack") != std::string::npos);
  CHECK_FALSE(pickle_problem(pk({0x80, 2, '(', 'K', 1, 'K', 2, 't', '.'})).has_value());  // MARK 1 2 TUPLE
  CHECK(pickle_problem(pk({0x80, 2, 'J', 1, 2})).value_or("").find("ends inside an opcode's argument") !=
        std::string::npos);
}

TEST_CASE("a tensor whose sizes reach past its storage record is refused before anything reads it") {
  at::Tensor t = at::arange(4, at::kFloat);
  CHECK_FALSE(tp::io::tensor_extent_problem(t).has_value());
  CHECK_FALSE(tp::io::tensor_extent_problem(t.narrow(0, 1, 3)).has_value());  // offset 1, 3 elements: the end
  CHECK_FALSE(tp::io::tensor_extent_problem(at::empty({0, 5})).has_value());
  at::Tensor wide = at::arange(4, at::kFloat);
  wide.unsafeGetTensorImpl()->set_sizes_contiguous({5});  // what the Unpickler does with a pickle's sizes
  CHECK(tp::io::tensor_extent_problem(wide).value_or("").find("reach past the 4 elements of the storage record") !=
        std::string::npos);
  at::Tensor shifted = at::arange(4, at::kFloat).narrow(0, 1, 3);
  shifted.unsafeGetTensorImpl()->set_storage_offset(2);
  CHECK(tp::io::tensor_extent_problem(shifted).has_value());
  at::Tensor huge = at::arange(4, at::kFloat);
  const std::vector<std::int64_t> sizes{2, 3}, strides{std::int64_t(1) << 62, 1};
  huge.unsafeGetTensorImpl()->set_sizes_and_strides(c10::IntArrayRef(sizes), c10::IntArrayRef(strides));
  CHECK(tp::io::tensor_extent_problem(huge).has_value());
}

// A tensor dump, by hand: one call whose output's data_name is `output_name`.
void tensor_dump(const fs::path& rank, const std::string& output_name, double scale) {
  fs::create_directories(rank / "dump_tensor_data");
  const Json arg = tensor_arg("Functional.relu.0.forward.input.0.pt");
  Json out = tensor_arg(output_name);
  const Json doc = {
      {"task", "tensor"},
      {"level", "L1"},
      {"framework", "pytorch"},
      {"dump_data_dir", (rank / "dump_tensor_data").string()},
      {"data",
       {{"Functional.relu.0.forward", {{"input_args", {arg}}, {"input_kwargs", Json::object()}, {"output", {out}}}}}}};
  std::ofstream(rank / "dump.json") << doc.dump(1);
  write(rank / "dump_tensor_data" / "Functional.relu.0.forward.input.0.pt",
        pt_bytes(at::arange(3, at::kFloat) * scale));
}

TEST_CASE(
    "compare reads no .pt outside dump_tensor_data: a data_name with a directory part gets 'unsupported' and a "
    "message") {
  tptest::TempDir tmp;
  const fs::path root = tmp.path();
  write(root / "secret.pt", pt_bytes(at::full({3}, 42.0)));
  const std::string escape = "../../secret.pt";
  tensor_dump(root / "a" / "rank0", escape, 1.0);
  tensor_dump(root / "b" / "rank0", escape, 1.0);
  std::vector<fs::path> read;
  tp::compare::CompareOptions o;
  o.target = root / "a" / "rank0" / "dump.json";
  o.bench = root / "b" / "rank0" / "dump.json";
  o.out = root / "out";
  o.timestamp = "20260101000000";
  o.pt_cells = [&](const fs::path& n, const fs::path& b) {
    read.push_back(n);
    read.push_back(b);
    return tp::compare::pt_tensor_cells(n, b);
  };
  std::ostringstream log;
  tp::compare::run_compare(o, log);
  INFO(log.str());
  // The input's pair was read; the output's names were refused before any path was made of them.
  CHECK(read ==
        std::vector<fs::path>{root / "a" / "rank0" / "dump_tensor_data" / "Functional.relu.0.forward.input.0.pt",
                              root / "b" / "rank0" / "dump_tensor_data" / "Functional.relu.0.forward.input.0.pt"});
  CHECK(log.str().find("data_name \"../../secret.pt\" of ") != std::string::npos);
  CHECK(log.str().find("is not read: a file name may not hold a directory part") != std::string::npos);
  const std::string csv = tptest::read_text((root / "out" / "compare_result_20260101000000.csv").string());
  CHECK(csv.find("unsupported,unsupported,unsupported,unsupported,unsupported,unsupported") != std::string::npos);
}

}  // namespace hostile_input_test
