// Text files from others that once crashed or misled a reader (found by the fuzz targets in
// tests/fuzz, issue 46): each is refused with a message that names the file or the place and what
// was expected. The corpus in tests/fuzz/corpus replays the same inputs without checking messages.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

#include "torchprobe/analysis/compare/json_reader.hpp"
#include "torchprobe/config/parser.hpp"
#include "torchprobe/io/journal_reader.hpp"
#include "torchprobe/io/npy.hpp"

namespace {

namespace fs = std::filesystem;

// A file of `text` in the temporary directory, removed with the object.
struct TextFile {
  fs::path path;
  explicit TextFile(const std::string& text) {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("torchprobe_hostile_text_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::ofstream(path, std::ios::binary) << text;
  }
  ~TextFile() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

std::string config_rejection(const std::string& text) {
  const TextFile f(text);
  try {
    torchprobe::load_config_file(f.path.string());
  } catch (const torchprobe::ConfigError& e) {
    return e.what();
  }
  return "(accepted)";
}

std::string nested_arrays(int levels) {
  return std::string(static_cast<std::size_t>(levels), '[') + std::string(static_cast<std::size_t>(levels), ']');
}

std::string json_rejection(const std::string& text) {
  try {
    torchprobe::compare::parse_json_text(text);
  } catch (const torchprobe::compare::JsonSyntaxError& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("a config number that no double holds is a ConfigError naming the file, not an escaped json exception") {
  const std::string message = config_rejection(R"({"task": "statistics", "step": [1E999]})");
  INFO(message);
  CHECK(message.find("torchprobe_hostile_text_") != std::string::npos);
  CHECK(message.find("is not valid JSON") != std::string::npos);
}

TEST_CASE("a config nested deeper than 64 levels is refused while it is parsed; 64 levels parse") {
  // Levels are containers: the object and 64 arrays in it make 65.
  const std::string deep = config_rejection(R"({"task": "statistics", "x": )" + nested_arrays(64) + "}");
  INFO(deep);
  CHECK(deep.find("nests values deeper than 64 levels") != std::string::npos);
  // One level less: the JSON is read, and the unknown key is what the config then refuses.
  const std::string shallow = config_rejection(R"({"task": "statistics", "x": )" + nested_arrays(63) + "}");
  INFO(shallow);
  CHECK(shallow.find("nests values") == std::string::npos);
}

TEST_CASE("compare's JSON reader refuses values nested deeper than 512 levels and reads 512") {
  using torchprobe::compare::kMostJsonDepth;
  CHECK(json_rejection(nested_arrays(static_cast<int>(kMostJsonDepth))) == "(accepted)");
  const std::string deeper = json_rejection(nested_arrays(static_cast<int>(kMostJsonDepth) + 1));
  INFO(deeper);
  CHECK(deeper.find("nested deeper than 512 levels") != std::string::npos);
  // A million '[' ends with the same refusal, not with the stack.
  CHECK(json_rejection(std::string(1u << 20, '[')).find("nested deeper") != std::string::npos);
}

TEST_CASE("a journal whose end line counts more entries than an int64 holds is a ReadError naming the line") {
  const TextFile f(R"({"journal": 1, "task": "statistics", "level": "mix"})"
                   "\n"
                   R"({"end": true, "entries": 99999999999999999999})"
                   "\n");
  torchprobe::io::recovery::details::JournalText j;
  std::ostringstream err;
  std::string message = "(accepted)";
  try {
    torchprobe::io::recovery::details::read_journal(f.path.string(), j, err);
  } catch (const torchprobe::io::recovery::details::ReadError& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find(f.path.string() + ":2:") != std::string::npos);
  CHECK(message.find("99999999999999999999 is not a count") != std::string::npos);
}

TEST_CASE(
    "a .npy shape larger than the file is refused without overflowing, and a product that would overflow "
    "is truncated data") {
  const auto npy_with_shape = [](const std::string& shape) {
    std::string header = "{'descr': '|u1', 'fortran_order': False, 'shape': (" + shape + "), }";
    header.resize(118, ' ');
    header += '\n';
    std::string file = "\x93NUMPY";
    file += '\x01';
    file += '\x00';
    file += static_cast<char>(header.size() & 0xFF);
    file += static_cast<char>(header.size() >> 8);
    return file + header + std::string(4, '\0');  // four bytes
  };
  std::string why;
  CHECK(torchprobe::io::parse_npy(npy_with_shape("4,"), &why).has_value());
  CHECK_FALSE(torchprobe::io::parse_npy(npy_with_shape("99999999999999999999999,"), &why).has_value());
  CHECK(why.find("larger than the file") != std::string::npos);
  // Each size fits the file, their product no integer: truncated, and UBSan stays quiet.
  CHECK_FALSE(
      torchprobe::io::parse_npy(npy_with_shape("100, 100, 100, 100, 100, 100, 100, 100, 100, 100,"), &why).has_value());
  CHECK(why.find("truncated") != std::string::npos);
}
