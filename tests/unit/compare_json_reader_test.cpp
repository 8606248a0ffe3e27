// compare's JSON reader (json_reader.hpp) gives what nlohmann::ordered_json::parse gives, on the
// texts nlohmann accepts, plus Python's NaN / Infinity; it rejects what nlohmann rejects; a repeated
// key keeps its first place and its last value in small and in large (hash-indexed) objects.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "torchprobe/analysis/compare/json_reader.hpp"

namespace compare_json_reader_test {
// nlohmann 3.11.3's parse() is [[nodiscard]], and GCC does not take a cast to void for a use.
inline std::size_t parsed_by_nlohmann(const std::string& text) { return nlohmann::ordered_json::parse(text).size(); }

using torchprobe::compare::JsonSyntaxError;
using torchprobe::compare::parse_json_text;
using Json = nlohmann::ordered_json;

TEST_CASE("compare's JSON reader equals nlohmann's parse, value types included") {
  for (
      const char* text : {
          R"({"a": 1, "b": -2, "c": 1.5, "d": 1e3, "e": -0, "f": 0.0, "g": 18446744073709551615,
               "h": 18446744073709551616, "i": -9223372036854775808, "j": -9223372036854775809,
               "k": 1E-400, "l": 4.9e-324, "m": 0.30000000000000004, "n": 123456789012345678901234567890})",
          R"([true, false, null, "", "x\"y\\z\/\b\f\n\r\t", "\u00e9\u20ac\ud83d\ude00", "é€😀", [], {}, [[1], {"a": []}]])",
          R"(  {"nested": {"deep": [1, {"x": null}]}, "s": "tab\tnew\nline"}  )",
          "3",
          "\"text\"",
          "-1.25e-5",
      }) {
    CAPTURE(text);
    const Json mine = parse_json_text(text), theirs = Json::parse(text);
    CHECK(mine == theirs);
    CHECK(mine.dump() == theirs.dump());  // same types: 1 stays unsigned, -2 integer, 1.5 float
  }
}

TEST_CASE("compare's JSON reader reads Python's NaN, Infinity and -Infinity as doubles") {
  const Json j = parse_json_text(R"({"a": NaN, "b": Infinity, "c": -Infinity, "d": [NaN], "e": "NaN"})");
  CHECK(std::isnan(j["a"].get<double>()));
  CHECK(j["b"].get<double>() == HUGE_VAL);
  CHECK(j["c"].get<double>() == -HUGE_VAL);
  CHECK(std::isnan(j["d"][0].get<double>()));
  CHECK(j["e"] == "NaN");
}

TEST_CASE("compare's JSON reader: a repeated key keeps its first place and its last value") {
  CHECK(parse_json_text(R"({"a": 1, "b": 2, "a": 3})").dump() == Json::parse(R"({"a": 1, "b": 2, "a": 3})").dump());
  std::string big = "{";
  for (int i = 0; i < 1000; ++i) big += "\"k" + std::to_string(i) + "\": " + std::to_string(i) + ", ";
  big += "\"k5\": \"five\", \"k999\": \"last\", \"k500\": 0}";
  const Json mine = parse_json_text(big);
  CHECK(mine.dump() == Json::parse(big).dump());
  CHECK(mine.size() == 1000);
  CHECK(mine.begin().key() == "k0");
  CHECK(mine["k5"] == "five");
}

TEST_CASE("compare's JSON reader rejects what nlohmann rejects, naming the byte") {
  for (const char* text : {"",
                           "{",
                           "{\"a\": 1",
                           "{\"a\" 1}",
                           "[1, 2",
                           "[1,]",
                           "{\"a\": 1,}",
                           "01",
                           "1.",
                           "-",
                           "1e",
                           ".5",
                           "+1",
                           "tru",
                           "nul",
                           "\"abc",
                           "\"a\x01b\"",
                           "\"\\x\"",
                           "\"\\u12\"",
                           "\"\\ud800\"",
                           "\"\\udc00\"",
                           "\"\xff\"",
                           "\"\xc0\xaf\"",
                           "\"\xed\xa0\x80\"",
                           "1 2",
                           "{} x",
                           "nan",
                           "inf"}) {
    CAPTURE(text);
    CHECK_THROWS_AS(parsed_by_nlohmann(text), Json::parse_error);
    CHECK_THROWS_AS(parse_json_text(text), JsonSyntaxError);
  }
  CHECK_THROWS_AS(parsed_by_nlohmann("[1e400]"), Json::out_of_range);  // a double's overflow
  CHECK_THROWS_AS(parse_json_text("[1e400]"), JsonSyntaxError);
  try {
    parse_json_text("{\"a\": [1, 2}");
    FAIL("no error");
  } catch (const JsonSyntaxError& e) {
    // nlohmann counts the bytes read, the offending one included (column 12)
    CHECK(std::string(e.what()).find("byte 12") != std::string::npos);
  }
}

}  // namespace compare_json_reader_test
