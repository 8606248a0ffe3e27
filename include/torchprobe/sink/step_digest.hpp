#pragma once
// The step's ranks_digest.bin (io/rank_digest.hpp) from its records, on the step writer's thread,
// beside dump.json. An entry the digest keeps (a collective, a module with parameters, a
// parameters_grad entry: few) is made JSON; the others, mostly API calls in compact form, are only
// walked for the rank's first non-finite tensor, item by item (DeferredBody::visit_items), until
// one is found, without being made JSON.
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "torchprobe/core/record.hpp"
#include "torchprobe/core/tensor_json.hpp"
#include "torchprobe/io/rank_digest.hpp"
#include "torchprobe/io/rank_items.hpp"

namespace torchprobe {

namespace step_digest {

// "/input_args/0" -> "input_args.0" (a JSON pointer's tokens unescaped: "~1" is "/", "~0" is "~").
inline std::string dotted(std::string_view pointer) {
  std::string out;
  for (std::size_t i = pointer.empty() || pointer[0] != '/' ? 0 : 1; i < pointer.size(); ++i) {
    const char c = pointer[i];
    if (c == '/') {
      out += '.';
    } else if (c == '~' && i + 1 < pointer.size() && (pointer[i + 1] == '0' || pointer[i + 1] == '1')) {
      out += pointer[++i] == '1' ? '/' : '~';
    } else {
      out += c;
    }
  }
  return out;
}

inline bool nonfinite(const StatValue& v) { return v.kind == StatValue::Kind::Float && !std::isfinite(v.d); }

// The first non-finite tensor on each side of a compact body's items, as rank_items::nonfinite_in_entry
// finds it in the entry's JSON.
class FirstNonFinite final : public DeferredItems {
 public:
  std::string input, output;
  void summary(const std::string& pointer, bool is_output, const TensorSummary& s) override {
    std::string& side = is_output ? output : input;
    if (side.empty() && (nonfinite(s.stats.max) || nonfinite(s.stats.min))) side = dotted(pointer);
  }
  void json(const std::string& pointer, bool is_output, const nlohmann::ordered_json& item) override {
    std::string& side = is_output ? output : input;
    if (!side.empty()) return;
    std::string path = dotted(pointer);
    if (io::rank_items::first_nonfinite_item<io::rank_items::NlohmannNodes>(&item, path)) side = std::move(path);
  }
};

// Adds one record (one entry of dump.json) to the digest.
inline void add_record(io::RankDigestBuilder& digest, const Record& r) {
  using io::rank_items::NlohmannNodes;
  const bool has_parameters = r.body.is_object() && r.body.contains("parameters");
  if (io::RankDigestBuilder::keeps(r.name, has_parameters) || (!r.deferred && !digest.nonfinite_found())) {
    if (!r.deferred) {
      digest.add<NlohmannNodes>(r.name, &r.body);
    } else {
      const nlohmann::ordered_json body = r.json_body();
      digest.add<NlohmannNodes>(r.name, &body);
    }
    return;
  }
  if (digest.nonfinite_found()) {
    digest.add_unkept(r.name, "", "");
    return;
  }
  // A compact body (and the JSON members beside it, which come first in the entry).
  FirstNonFinite first;
  io::rank_items::nonfinite_sides<NlohmannNodes>(&r.body, first.input, first.output);
  r.deferred->visit_items(first);
  digest.add_unkept(r.name, std::move(first.input), std::move(first.output));
}

// The digest's bytes for the entries dump.json lists, in its order.
inline std::string digest_of(const std::vector<const Record*>& entries) {
  io::RankDigestBuilder digest;
  for (const Record* r : entries) add_record(digest, *r);
  return io::encode_rank_digest(digest.digest());
}

}  // namespace step_digest

}  // namespace torchprobe
