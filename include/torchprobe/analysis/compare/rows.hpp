#pragma once
// A dump's entries flattened into msprobe's compare rows: one row per tensor/scalar leaf, named
// `{entry}.{input|output|parameters}.{index path}` (parameters_grad rows `{entry}.{param}`), in the
// order input, parameters, output, parameters_grad within an entry (msprobe's op_item_parse,
// gen_op_item, reorder_index), with the compare key in which backward call numbers are recounted
// by order of appearance (ProcessDf.update_backward_call).
#include <nlohmann/json.hpp>
#include <zlib.h>

#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "torchprobe/analysis/compare/dump_reader.hpp"
#include "torchprobe/analysis/compare/python_text.hpp"

namespace torchprobe::compare {

using Json = nlohmann::ordered_json;

struct Row {
  std::string name;             // NPU/Bench Name
  std::string key;              // compare key: name with the backward call number recounted
  std::string entry;            // the dump.json entry it belongs to
  std::string entry_key;        // the entry's name with the backward call number recounted
  std::size_t entry_index = 0;  // the entry's position in dump order
  std::string state;            // input | output | parameters | parameters_grad
  std::string dtype, shape;     // str() of msprobe's values
  Json stats[4];                // Max, Min, Mean, Norm as msprobe's table holds them ("None", "Nan" as strings)
  std::string requires_grad = "N/A";
  std::string md5;
  std::string data_name = "-1";
  std::optional<std::string> stack;  // str(list of frames), on an entry's first row only
  bool is_output() const { return name.find(".output.") != std::string::npos; }
};

// msprobe's float class of dtypes: fp16, bf16 and fp32 compare with each other.
inline bool float_dtype(const std::string& d) {
  return d == "torch.float16" || d == "torch.float32" || d == "torch.bfloat16";
}

namespace detail {

inline std::vector<std::string> split_dots(const std::string& s) {
  std::vector<std::string> parts(1);
  for (const char c : s) {
    if (c == '.')
      parts.emplace_back();
    else
      parts.back() += c;
  }
  return parts;
}

inline std::string join_dots(const std::vector<std::string>& p, std::size_t n) {
  std::string out;
  for (std::size_t i = 0; i < n && i < p.size(); ++i) out += (i ? "." : "") + p[i];
  return out;
}

inline std::string crc32_hex(const std::string& s) {
  const auto crc = ::crc32(0L, reinterpret_cast<const Bytef*>(s.data()), static_cast<uInt>(s.size()));
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08lx", static_cast<unsigned long>(crc));
  return buf;
}

// msprobe's set_summary: a value whose str() is "nan" in any case becomes the string "Nan".
inline Json summary_cell(const Json& v) {
  if (v.is_null()) return "None";
  const std::string s = py_str(v);
  if (s == "nan" || s == "NaN" || s == "Nan" || s == "NAN") return "Nan";
  return v;
}

inline Row leaf_row(const Json& item, const std::string& op_name, const std::string& state) {
  Row r;
  r.state = state;
  static const Json kNull;
  const auto get = [&](const char* k) -> const Json& {  // a reference: a copy per key cost a row's time
    const auto it = item.find(k);
    return it == item.end() ? kNull : *it;
  };
  const Json& data_name = get("data_name");
  if (data_name.is_string() && !data_name.get<std::string>().empty()) r.data_name = data_name.get<std::string>();
  r.name = op_name;
  if (r.data_name != "-1") r.name = r.data_name.substr(0, r.data_name.rfind('.'));
  if (item.contains("requires_grad") && !item["requires_grad"].is_null())
    r.requires_grad = py_str(item["requires_grad"]);
  static const char* kStats[4] = {"Max", "Min", "Mean", "Norm"};
  Json stats[4];
  for (int i = 0; i < 4; ++i) stats[i] = get(kStats[i]);
  const Json& dtype = get("dtype");
  const bool has_dtype = !(dtype.is_null() || (dtype.is_string() && dtype.get<std::string>().empty()) ||
                           (dtype.is_boolean() && !dtype.get<bool>()));
  const std::string type = get("type").is_string() ? get("type").get<std::string>() : "";
  const Json& value = get("value");
  if (has_dtype) {
    r.dtype = py_str(dtype);
    r.shape = py_str(get("shape"));
  } else if (type == "torch.Size") {
    r.dtype = type;
    r.shape = py_str(value);
  } else if (type == "slice") {
    r.dtype = type;
    r.shape = "(" + std::to_string(value.is_array() ? value.size() : 0) + ",)";
  } else if (type == "ellipsis") {
    r.dtype = type;
    r.shape = "[]";
    for (auto& s : stats) s = value;
  } else {
    static const std::map<nlohmann::detail::value_t, std::string> kClass = {
        {nlohmann::detail::value_t::null, "<class 'NoneType'>"},
        {nlohmann::detail::value_t::boolean, "<class 'bool'>"},
        {nlohmann::detail::value_t::number_integer, "<class 'int'>"},
        {nlohmann::detail::value_t::number_unsigned, "<class 'int'>"},
        {nlohmann::detail::value_t::number_float, "<class 'float'>"},
        {nlohmann::detail::value_t::string, "<class 'str'>"},
        {nlohmann::detail::value_t::array, "<class 'list'>"},
        {nlohmann::detail::value_t::object, "<class 'dict'>"}};
    const auto cls = kClass.find(value.type());
    r.dtype = cls == kClass.end() ? "<class 'object'>" : cls->second;
    r.shape = "[]";
    for (auto& s : stats) s = value;
  }
  for (int i = 0; i < 4; ++i) r.stats[i] = summary_cell(stats[i]);
  const Json& md5 = get("md5");
  r.md5 = md5.is_string() && !md5.get<std::string>().empty() ? md5.get<std::string>()
                                                             : crc32_hex(item.contains("value") ? py_str(value) : "");
  return r;
}

// msprobe's op_item_parse.
inline void parse_items(const Json& data, const std::string& op_name, const std::string& state, int depth,
                        std::vector<Row>& out) {
  if (depth > 50) throw InputError("entry " + op_name + " nests deeper than 50 levels");
  if (data.is_null()) {
    Row r;
    r.name = op_name;
    r.state = state;
    r.dtype = r.shape = "None";
    for (auto& s : r.stats) s = "None";
    out.push_back(std::move(r));
    return;
  }
  if (data.empty()) return;
  if (data.is_array()) {
    const bool grads = [&] {
      for (const auto& p : split_dots(op_name)) {
        if (p == "parameters_grad") return true;
      }
      return false;
    }();
    for (std::size_t i = 0; i < data.size(); ++i)
      parse_items(data[i], grads ? op_name : op_name + "." + std::to_string(i), state, depth + 1, out);
  } else if (data.is_object()) {
    if (data.contains("type") && data["type"].is_string()) {
      out.push_back(leaf_row(data, op_name, state));
      return;
    }
    for (auto it = data.begin(); it != data.end(); ++it)
      parse_items(it.value(), op_name + "." + it.key(), state, depth + 1, out);
  }
}

}  // namespace detail

// The rows of one dump, in msprobe's order, with their compare keys.
inline std::vector<Row> dump_rows(const Dump& d) {
  std::vector<Row> rows;
  std::map<std::string, int> backward_count;
  std::size_t index = 0;
  for (auto it = d.data.begin(); it != d.data.end(); ++it, ++index) {
    const std::string& op_name = it.key();
    const Json& op = it.value();
    const auto parts = detail::split_dots(op_name);
    const std::string last = parts.back(), second = parts.size() >= 2 ? parts[parts.size() - 2] : "";
    std::vector<Row> items;
    if (last == "parameters_grad" || second == "parameters_grad") {
      detail::parse_items(op, op_name, "parameters_grad", 0, items);
    } else {
      static const std::pair<const char*, const char*> kIo[] = {{"input_args", "input"},
                                                                {"input_kwargs", "input"},
                                                                {"input", "input"},
                                                                {"output", "output"},
                                                                {"parameters", "parameters"}};
      for (const auto& [key, state] : kIo) {
        if (op.contains(key)) detail::parse_items(op[key], op_name + "." + state, state, 0, items);
      }
    }
    // split_data_name_components: entries named neither ...forward/backward[.N] nor parameters_grad
    // are skipped by msprobe.
    std::string stem, call, direction;
    if (last == "parameters_grad" || second == "parameters_grad") {
      stem = detail::join_dots(parts, parts.size() - 1);
      direction = "parameters_grad";
    } else if (last == "forward" || second == "forward" || last == "backward" || second == "backward") {
      direction = (last == "forward" || second == "forward") ? "forward" : "backward";
      stem = parts.size() > 2 ? detail::join_dots(parts, parts.size() - 2) : "";
      call = second + "." + last;
    }
    if (stem.empty()) continue;
    int order = 0;  // counted even for an entry without rows, as msprobe does
    if (direction == "backward") order = backward_count[stem]++;
    if (items.empty()) continue;
    const auto is_digits = [](const std::string& s) {
      return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
    };
    std::string new_call = call;
    if (direction == "backward" && (is_digits(second) || is_digits(last))) {
      new_call =
          (is_digits(second) ? std::to_string(order) : second) + "." + (is_digits(last) ? std::to_string(order) : last);
    }
    // reorder_index: inputs (and anything else), parameters, outputs, parameters_grad.
    // Each row's place is decided before any is moved (a row is moved, not copied, into `ordered`).
    const auto place = [](const std::string& state) {
      return state == "parameters" ? 1 : state == "output" ? 2 : state == "parameters_grad" ? 3 : 0;
    };
    std::vector<int> places;
    places.reserve(items.size());
    for (const Row& r : items) places.push_back(place(r.state));
    std::vector<Row> ordered;
    ordered.reserve(items.size());
    for (int p = 0; p < 4; ++p) {
      for (std::size_t k = 0; k < items.size(); ++k)
        if (places[k] == p) ordered.push_back(std::move(items[k]));
    }
    for (std::size_t i = 0; i < ordered.size(); ++i) {
      Row& r = ordered[i];
      r.entry = op_name;
      r.entry_index = index;
      std::string suffix = r.name;  // full name with every occurrence of the entry name removed
      for (std::size_t pos; (pos = suffix.find(op_name)) != std::string::npos;) suffix.erase(pos, op_name.size());
      r.entry_key = new_call == call ? op_name : stem + "." + new_call;
      r.key = new_call == call ? r.name : r.entry_key + suffix;
      if (i == 0 && d.has_stack_file) {
        const auto s = d.stacks.find(op_name);
        if (s != d.stacks.end() && !s->second.is_null()) r.stack = py_str(s->second);
      }
      rows.push_back(std::move(r));
    }
  }
  return rows;
}

}  // namespace torchprobe::compare
