#pragma once
// A dump.json read straight into compare rows, one entry at a time. Reading the whole "data" object
// into JSON nodes first (load_dump) costs gigabytes for a million entries and most of the reading
// time; here the file is read in pieces (json_pieces.hpp), each entry's text is parsed by simdjson's
// DOM parser and turned into rows by RowMaker (rows.hpp), and only the entry names are kept
// (Dump::data, values null): neither the whole text nor a tree of it is ever held. Any text that is
// not plain (Python's NaN or Infinity, a repeated entry name, invalid JSON, a number beyond 64 bits,
// an entry that is not an object, ...) is read by load_dump instead, which gives it exactly the
// meaning and the error messages it always had. Without simdjson (TORCHPROBE_HAVE_SIMDJSON unset: a
// build that did not find it) every dump is read that way.
#include <algorithm>
#include <new>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "torchprobe/analysis/compare/dump_reader.hpp"
#include "torchprobe/analysis/compare/rows.hpp"

#if defined(TORCHPROBE_HAVE_SIMDJSON)
#include <simdjson.h>

#include "torchprobe/analysis/compare/json_pieces.hpp"
#endif

namespace torchprobe::compare {

// A dump (its entries' values dropped) with its rows and their text.
struct DumpRows {
  Dump dump;
  std::vector<Row> rows;
  TextStore text;
};

namespace details {

// load_dump, then the rows, then the values dropped.
inline DumpRows dump_rows_through_json(const std::filesystem::path& dump_json, const std::string& text) {
  DumpRows out{dump_from_text(dump_json, text), {}, {}};
  RowSet rows = dump_rows(out.dump);
  out.rows = std::move(rows.rows);
  out.text = std::move(rows.text);
  drop_entry_values(out.dump);
  return out;
}

#if defined(TORCHPROBE_HAVE_SIMDJSON)
// A top-level value other than "data" (small: "task", "torchprobe_recovery", ...), read from its
// text by compare's JSON reader.
inline Json small_value(std::string_view text) {
  try {
    return parse_json_text(text);
  } catch (const JsonSyntaxError&) {
    throw NotPlain{};
  }
}

// An integer written -0 (nlohmann reads it as a signed integer, simdjson's DOM as 0 like any other):
// a text holding one anywhere (even inside a string) is load_dump's to read.
// (Each '-' found by memchr: memmem's set-up per call cost a second for the "-0." of a million
// entries' negative statistics.)
inline bool has_integer_negative_zero(std::string_view text) {
  const char* const end = text.data() + text.size();
  for (const char* p = text.data();
       (p = static_cast<const char*>(std::memchr(p, '-', static_cast<std::size_t>(end - p)))) != nullptr; ++p) {
    if (p + 1 == end || p[1] != '0') continue;
    const char next = p + 2 < end ? p[2] : ' ';
    if (next != '.' && next != 'e' && next != 'E' && !(next >= '0' && next <= '9')) return true;
  }
  return false;
}

// A node of simdjson's DOM for rows.hpp; `present` is false for a member that is not there.
struct DomNode {
  simdjson::dom::element value;
  bool present = false;
};

// Python's repr of a DOM value, as py_repr does it for nlohmann's.
inline std::string dom_py_repr(simdjson::dom::element v) {
  using T = simdjson::dom::element_type;
  switch (v.type()) {
    case T::NULL_VALUE: return "None";
    case T::BOOL: return bool(v) ? "True" : "False";
    case T::INT64: return std::to_string(std::int64_t(v));
    case T::UINT64: return std::to_string(std::uint64_t(v));
    case T::DOUBLE: return py_float_str(double(v));
    case T::STRING: return py_str_repr(std::string_view(v));
    case T::ARRAY: {
      std::string out = "[";
      bool first = true;
      for (simdjson::dom::element item : simdjson::dom::array(v)) {
        out += (first ? "" : ", ") + dom_py_repr(item);
        first = false;
      }
      return out + "]";
    }
    case T::OBJECT: {
      std::string out = "{";
      bool first = true;
      for (const auto member : simdjson::dom::object(v)) {
        out += (first ? "" : ", ") + py_str_repr(member.key) + ": " + dom_py_repr(member.value);
        first = false;
      }
      return out + "}";
    }
    default:  // a kind a newer simdjson adds (big integers): load_dump's to read
      break;
  }
  throw NotPlain{};
}

// A DOM value as the JSON value nlohmann's parser makes of the same text: a non-negative integer
// is number_unsigned, a negative one number_integer.
inline Json dom_to_json(simdjson::dom::element v) {
  using T = simdjson::dom::element_type;
  switch (v.type()) {
    case T::NULL_VALUE: return Json(nullptr);
    case T::BOOL: return Json(bool(v));
    case T::INT64: {
      const std::int64_t i = v;
      return i < 0 ? Json(i) : Json(static_cast<std::uint64_t>(i));
    }
    case T::UINT64: return Json(std::uint64_t(v));
    case T::DOUBLE: return Json(double(v));
    case T::STRING: return Json(std::string(std::string_view(v)));
    case T::ARRAY: {
      Json out = Json::array();
      for (simdjson::dom::element item : simdjson::dom::array(v)) out.push_back(dom_to_json(item));
      return out;
    }
    case T::OBJECT: {
      Json out = Json::object();
      auto& members = static_cast<Json::object_t::Container&>(out.get_ref<Json::object_t&>());
      for (const auto member : simdjson::dom::object(v))
        members.emplace_back(std::string(member.key), dom_to_json(member.value));
      return out;
    }
    default: break;
  }
  throw NotPlain{};
}

// A repeated key anywhere in the entry (load_dump keeps the first place and the last value; the
// DOM keeps both) makes it load_dump's to read; says whether some object has an "md5" key.
inline bool check_dom_entry(simdjson::dom::element v, int depth) {
  using T = simdjson::dom::element_type;
  if (depth > 64) throw NotPlain{};
  bool md5 = false;
  if (v.type() == T::ARRAY) {
    for (simdjson::dom::element item : simdjson::dom::array(v)) md5 = check_dom_entry(item, depth + 1) || md5;
  } else if (v.type() == T::OBJECT) {
    const simdjson::dom::object o(v);
    // A tensor's handful of keys compared pairwise, on the stack (a vector per object was an
    // allocation per object of every entry); more than 16 sorted.
    constexpr std::size_t kFew = 16;
    std::string_view few[kFew];
    std::size_t count = 0;
    std::vector<std::string_view> many;
    for (const auto member : o) {
      if (count < kFew) {
        for (std::size_t k = 0; k < count; ++k)
          if (few[k] == member.key) throw NotPlain{};
        few[count] = member.key;
      } else {
        if (many.empty()) many.assign(few, few + kFew);
        many.push_back(member.key);
      }
      ++count;
      md5 = md5 || member.key == "md5";
      md5 = check_dom_entry(member.value, depth + 1) || md5;
    }
    if (!many.empty()) {
      std::sort(many.begin(), many.end());
      if (std::adjacent_find(many.begin(), many.end()) != many.end()) throw NotPlain{};
    }
  }
  return md5;
}

template <>
struct NodeOps<DomNode> {
  static JsonType type(const DomNode& n) {
    using T = simdjson::dom::element_type;
    switch (n.value.type()) {
      case T::ARRAY: return JsonType::array;
      case T::OBJECT: return JsonType::object;
      case T::INT64: return std::int64_t(n.value) < 0 ? JsonType::number_integer : JsonType::number_unsigned;
      case T::UINT64: return JsonType::number_unsigned;
      case T::DOUBLE: return JsonType::number_float;
      case T::STRING: return JsonType::string;
      case T::BOOL: return JsonType::boolean;
      case T::NULL_VALUE: return JsonType::null;
      default: break;
    }
    throw NotPlain{};
  }
  static std::string_view string(const DomNode& n) { return std::string_view(n.value); }
  static std::string py_text(const DomNode& n) {
    return n.value.type() == simdjson::dom::element_type::STRING ? std::string(std::string_view(n.value))
                                                                 : dom_py_repr(n.value);
  }
  static Json cell(const DomNode& n) { return dom_to_json(n.value); }
  static std::size_t size(const DomNode& n) {
    return n.value.type() == simdjson::dom::element_type::ARRAY ? simdjson::dom::array(n.value).size()
                                                                : simdjson::dom::object(n.value).size();
  }
  template <class F>
  static void members(const DomNode& n, F&& f) {
    for (const auto member : simdjson::dom::object(n.value)) f(member.key, DomNode{member.value, true});
  }
  template <class F>
  static void items(const DomNode& n, F&& f) {
    for (simdjson::dom::element item : simdjson::dom::array(n.value)) f(DomNode{item, true});
  }
  static DomNode find(const DomNode& n, const char* key) {
    simdjson::dom::element v;
    if (simdjson::dom::object(n.value).at_key(key).get(v) != simdjson::SUCCESS) return {};
    return DomNode{v, true};
  }
  static bool found(const DomNode& n) { return n.present; }
};

// Starts reading `text` (its first `length` bytes) with simdjson's On-Demand parser, which reads up to
// SIMDJSON_PADDING bytes past a text: `text` gets them, as spaces.
inline simdjson::ondemand::document iterate_padded(simdjson::ondemand::parser& parser, std::string& text,
                                                   std::size_t length) {
  text.resize(length + simdjson::SIMDJSON_PADDING, ' ');
  return parser.iterate(simdjson::padded_string_view(text.data(), length, text.size()));
}

// Nothing but whitespace follows the document's value (else the text is not JSON).
inline bool read_to_end(simdjson::ondemand::document& doc) {
  return doc.current_location().error() == simdjson::OUT_OF_BOUNDS;
}

// construct.json read as load_construct_file reads it; a file it cannot take is read by that.
inline void load_construct_file_fast(Dump& d) {
  const std::filesystem::path construct = dump_dir(d) / "construct.json";
  if (!std::filesystem::exists(construct)) return;
  std::string text = read_text_file(construct, simdjson::SIMDJSON_PADDING);
  const std::size_t length = text.size();
  Parents parents;
  parents.reserve(length / 48);  // a line of construct.json is about that long: no rehash on the way
  try {
    if (has_python_floats(text)) throw NotPlain{};
    simdjson::ondemand::parser parser;
    simdjson::ondemand::document doc = iterate_padded(parser, text, length);
    for (auto field : doc.get_object()) {
      // Views of the parser's text, valid while the document is read: Parents keeps its own copies.
      const auto key = static_cast<std::string_view>(field.unescaped_key());
      simdjson::ondemand::value v = field.value();
      const auto type = v.type().value();
      std::string_view parent;
      if (type == simdjson::ondemand::json_type::string) {
        parent = static_cast<std::string_view>(v.get_string());
      } else if (type == simdjson::ondemand::json_type::null) {
        if (!v.is_null()) throw NotPlain{};
        if (parents.count(key)) throw NotPlain{};  // a repeated key: nlohmann keeps its last value
        continue;
      } else {
        throw NotPlain{};  // construct.json maps names to names or null
      }
      if (!parents.insert(key, parent)) throw NotPlain{};
    }
    if (!read_to_end(doc)) throw NotPlain{};
  } catch (const std::bad_alloc&) {
    throw;
  } catch (...) {  // NotPlain, simdjson's errors
    load_construct_file(d);
    return;
  }
  d.parents = std::move(parents);
}

// The fast path, reading the file in pieces of `piece` bytes (json_pieces.hpp); throws (NotPlain,
// simdjson's errors, ...) where load_dump must read the text.
inline DumpRows dump_rows_in_pieces(const std::filesystem::path& dump_json, std::size_t piece = std::size_t(8) << 20) {
  JsonPieces text(dump_json, piece);
  simdjson::dom::parser entry_parser;
  DumpRows out;
  Dump& d = out.dump;
  d.file = dump_json;
  d.data = Json::object();
  load_stack_file(d);  // before the rows: an entry's first row carries its stack
  load_construct_file_fast(d);
  RowMaker maker(d, out.text);
  // Room for the rows before they are made: growing a vector of rows moves them all, and touches
  // twice the memory. A tensor's JSON takes 200 bytes or more (a scalar's less: then the vector
  // grows); the pages of the room not used are never touched, so they cost address space only.
  std::error_code size_error;
  out.rows.reserve(static_cast<std::size_t>(std::filesystem::file_size(dump_json, size_error)) / 200);
  auto& names = static_cast<Json::object_t::Container&>(d.data.get_ref<Json::object_t&>());
  std::vector<std::uint64_t> name_hashes;  // a repeated entry name is load_dump's to read
  bool has_task = false, has_data = false;
  std::vector<std::string> seen_keys;
  // Each member of the outer object and of "data": a key, ':', a value, then ',' or the closing brace.
  const auto each_member = [&](const auto& take) {
    int c = text.next_token();
    if (c == '}') return;
    for (;; c = text.next_token()) {
      if (c != '"') throw NotPlain{};
      std::string key(text.string());
      text.expect(':');
      take(std::move(key));
      text.release();
      c = text.next_token();
      if (c == '}') return;
      if (c != ',') throw NotPlain{};
    }
  };
  text.expect('{');
  each_member([&](std::string key) {
    if (std::find(seen_keys.begin(), seen_keys.end(), key) != seen_keys.end()) throw NotPlain{};
    seen_keys.push_back(key);
    if (key != "data") {  // small values, read by compare's JSON reader
      const Json v = small_value(text.value());
      if (key == "task") {
        if (!v.is_string()) throw NotPlain{};
        d.task = v.get<std::string>();
        has_task = true;
      } else if (key == "level" && v.is_string()) {
        d.level = v.get<std::string>();
      } else if (key == "torchprobe_recovery") {
        Json doc_part = Json::object();
        doc_part["torchprobe_recovery"] = v;
        d.incomplete = recovery_missing(doc_part);
      }
      return;
    }
    text.expect('{');
    has_data = true;
    each_member([&](std::string name) {
      // The entry's text, parsed by simdjson's DOM parser where it lies, for members by key in any order.
      const std::string_view span = text.value();
      if (span.empty() || span.front() != '{' || has_integer_negative_zero(span)) throw NotPlain{};
      const simdjson::dom::element op = entry_parser.parse(span.data(), span.size(), false);
      const bool md5 = check_dom_entry(op, 0) || name == "md5";  // any_md5 counts entry names too
      d.has_md5 = d.has_md5 || md5;
      maker.add(name, DomNode{op, true}, out.rows);
      name_hashes.push_back(std::hash<std::string>{}(name));
      names.emplace_back(std::move(name), nullptr);
    });
  });
  if (text.next_token() != -1) throw NotPlain{};  // only whitespace after the outer object
  if (!has_task || !has_data || names.empty()) throw NotPlain{};
  std::sort(name_hashes.begin(), name_hashes.end());
  if (std::adjacent_find(name_hashes.begin(), name_hashes.end()) != name_hashes.end()) throw NotPlain{};
  return out;
}
#endif

}  // namespace details

// The dump at `dump_json` with its rows (rows.hpp), as load_dump + dump_rows would make them, and
// its entries' values dropped (drop_entry_values). Errors are load_dump's InputErrors.
inline DumpRows load_dump_rows(const std::filesystem::path& dump_json) {
  if (!std::filesystem::is_regular_file(dump_json)) throw InputError(dump_json.string() + ": no such file");
#if defined(TORCHPROBE_HAVE_SIMDJSON)
  try {
    return details::dump_rows_in_pieces(dump_json);
  } catch (const std::bad_alloc&) {
    throw;
  } catch (...) {
    // NotPlain, simdjson's errors, and any error of the side files or the rows: load_dump reads
    // the dump again and decides what is reported, in its order (dump.json before stack.json).
  }
#endif
  return details::dump_rows_through_json(dump_json, read_text_file(dump_json));
}

}  // namespace torchprobe::compare
