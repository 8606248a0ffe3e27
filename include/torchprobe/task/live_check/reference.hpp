#pragma once
// The reference of the live check (task/live_check.hpp): a dump.json read once, when the Debugger
// is made, into what judging an entry needs -- for each entry name, its tensor items by JSON
// pointer ("/input_args/0", "/output/0", "/input_kwargs/alpha", "/output/0/1"), each with its
// dtype, shape, four statistics and checksum. Entries of the run being checked are flattened the
// same way, so an item pairs with the reference's item at the same place of the same entry.
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "torchprobe/config/types.hpp"
#include "torchprobe/core/record.hpp"
#include "torchprobe/core/site.hpp"
#include "torchprobe/core/tensor_json.hpp"

namespace torchprobe::live {

using Json = nlohmann::ordered_json;

// One tensor item of an entry.
struct TensorItem {
  std::string pointer;  // where it sits in the entry's body
  std::string dtype;    // "torch.float32"
  std::vector<std::int64_t> shape;
  std::optional<double> stat[4];  // Max, Min, Mean, Norm; empty when null or not a number
  std::string md5;                // summary_mode md5's checksum, "" when there is none
  bool output = false;            // under "output" (else an input, a keyword argument or a parameter)
};
using Items = std::vector<TensorItem>;

namespace details {

inline std::optional<double> stat_number(const Json& v) {
  if (v.is_number()) return v.get<double>();
  if (v.is_boolean()) return v.get<bool>() ? 1.0 : 0.0;
  if (v.is_string()) {  // msprobe writes non-finite statistics as text
    const std::string& s = v.get_ref<const std::string&>();
    if (s == "nan" || s == "NaN") return std::nan("");
    if (s == "inf" || s == "Infinity") return HUGE_VAL;
    if (s == "-inf" || s == "-Infinity") return -HUGE_VAL;
  }
  return std::nullopt;
}

inline bool is_tensor_item(const Json& j) {
  return j.is_object() && j.contains("dtype") && j.contains("shape") && j.contains("Max") && j["dtype"].is_string() &&
         j["shape"].is_array();
}

inline void walk(const Json& j, const std::string& pointer, bool output, Items& out, int depth) {
  if (depth > 64) return;  // deeper than any call's arguments: not judged
  if (is_tensor_item(j)) {
    TensorItem t;
    t.pointer = pointer;
    t.dtype = j["dtype"].get<std::string>();
    for (const Json& d : j["shape"])
      if (d.is_number_integer()) t.shape.push_back(d.get<std::int64_t>());
    const char* keys[4] = {"Max", "Min", "Mean", "Norm"};
    for (int s = 0; s < 4; ++s)
      if (j.contains(keys[s])) t.stat[s] = stat_number(j[keys[s]]);
    if (j.contains("md5") && j["md5"].is_string()) t.md5 = j["md5"].get<std::string>();
    t.output = output;
    out.push_back(std::move(t));
  } else if (j.is_array()) {
    for (std::size_t i = 0; i < j.size(); ++i) walk(j[i], pointer + "/" + std::to_string(i), output, out, depth + 1);
  } else if (j.is_object()) {
    for (const auto& kv : j.items()) walk(kv.value(), pointer + "/" + pointer_token(kv.key()), output, out, depth + 1);
  }
}

}  // namespace details

// The tensor items of an entry's body, in the body's order.
inline Items flatten(const Json& body) {
  Items out;
  if (!body.is_object()) return out;
  for (const auto& kv : body.items())
    details::walk(kv.value(), "/" + pointer_token(kv.key()), kv.key() == "output", out, 0);
  return out;
}

// The tensor items of an entry's compact part (DeferredBody), added to `out`: a summary is read
// as it is, without making its JSON.
inline void add_deferred(const DeferredBody& deferred, Items& out) {
  struct Collect final : DeferredItems {
    explicit Collect(Items& items) : items(items) {}
    void summary(const std::string& pointer, bool output, const TensorSummary& s) override {
      TensorItem t;
      t.pointer = pointer;
      t.dtype = dtype_name(s.dtype);
      t.shape.assign(s.shape.begin(), s.shape.end());
      const StatValue* stats[4] = {&s.stats.max, &s.stats.min, &s.stats.mean, &s.stats.norm};
      for (int k = 0; k < 4; ++k) {
        switch (stats[k]->kind) {
          case StatValue::Kind::Null: break;
          case StatValue::Kind::Bool: t.stat[k] = stats[k]->b ? 1.0 : 0.0; break;
          case StatValue::Kind::Int: t.stat[k] = static_cast<double>(stats[k]->i); break;
          case StatValue::Kind::Float: t.stat[k] = stats[k]->d; break;
        }
      }
      t.output = output;
      items.push_back(std::move(t));
    }
    void json(const std::string& pointer, bool output, const Json& item) override {
      details::walk(item, pointer, output, items, 1);
    }
    Items& items;
  };
  Collect collect(out);
  deferred.visit_items(collect);
}

// The reference dump, by entry name.
class Reference {
 public:
  // `path`: a dump.json, or a directory holding one (a rank directory). Throws ConfigError naming
  // `key` when it cannot be read or is not a dump.json.
  Reference(const std::string& path, const std::string& key) {
    std::string file = path;
    std::ifstream probe(file + "/dump.json");
    if (probe) file += "/dump.json";
    std::ifstream in(file, std::ios::binary);
    const std::string allowed = "a dump.json of an earlier run (msprobe's or TorchProbe's), or its rank directory";
    if (!in) throw ConfigError("config key \"" + key + "\": " + path + " cannot be read (allowed: " + allowed + ")");
    std::stringstream text;
    text << in.rdbuf();
    Json doc;
    try {
      // A hostile file is refused before nlohmann's recursive parser goes deep.
      doc = Json::parse(text.str(), [](int depth, Json::parse_event_t, Json&) {
        if (depth > 512) throw std::runtime_error("nested deeper than 512 levels");
        return true;
      });
    } catch (const std::exception& e) {
      throw ConfigError("config key \"" + key + "\": " + file + " is not valid JSON (" + e.what() +
                        "; allowed: " + allowed + ")");
    }
    if (!doc.is_object() || !doc.contains("data") || !doc["data"].is_object())
      throw ConfigError("config key \"" + key + "\": " + file + " has no \"data\" object (allowed: " + allowed + ")");
    file_ = file;
    if (doc.contains("summary_mode") && doc["summary_mode"].is_string()) md5_ = doc["summary_mode"] == "md5";
    for (const auto& kv : doc["data"].items()) {
      const std::string& n = kv.key();
      for (const char* family : {"Functional.", "Tensor.", "Torch.", "NPU.", "VF.", "Jit."})
        if (n.rfind(family, 0) == 0) python_ = true;
      aten_ = aten_ || n.rfind("Aten.", 0) == 0;
      Items items = flatten(kv.value());
      for (const TensorItem& t : items) md5_ = md5_ || !t.md5.empty();
      entries_.emplace(n, std::move(items));
    }
  }

  const std::string& file() const { return file_; }
  std::size_t size() const { return entries_.size(); }
  // The entry's items, or null when the reference has no entry of that name.
  const Items* find(const std::string& name) const {
    const auto it = entries_.find(name);
    return it == entries_.end() ? nullptr : &it->second;
  }
  // Checksums are what it holds (summary_mode md5).
  bool md5() const { return md5_; }
  // Its Mean and Norm may be float sums (msprobe's Python dumps; a dump of modules only cannot
  // tell), as compare's statistics_origin.hpp decides.
  bool float_sums() const { return python_ || !aten_; }

 private:
  std::string file_;
  std::unordered_map<std::string, Items> entries_;
  bool md5_ = false, python_ = false, aten_ = false;
};

}  // namespace torchprobe::live
