#pragma once
// An entry's body and a tensor's statistics item as text (io/json_text.hpp), straight from the
// compact form the capture keeps: dump.json and the journal's lines are written without building
// a JSON tree for them.
#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>

#include "torchprobe/core/record.hpp"
#include "torchprobe/core/tensor_json.hpp"
#include "torchprobe/core/tensor_stats.hpp"
#include "torchprobe/io/json_text.hpp"
#include "torchprobe/io/python_json.hpp"

namespace torchprobe::io {

inline void write_stat(JsonText& out, const StatValue& v) {
  switch (v.kind) {
    case StatValue::Kind::Null: out.null(); return;
    case StatValue::Kind::Bool: out.boolean(v.b); return;
    case StatValue::Kind::Int: out.integer(v.i); return;
    case StatValue::Kind::Float: out.real(v.d); return;
  }
}

// The item tensor_item(s) builds (core/tensor_json.hpp), at `depth`.
inline void write_tensor_item(JsonText& out, const TensorSummary& s, int depth) {
  out.open_object();
  out.plain_key(0, depth, "\"type\": \"torch.Tensor\"");
  out.plain_key(1, depth, "\"dtype\": ");
  out.plain_string(dtype_name(s.dtype));  // "torch.float32": nothing to escape
  out.plain_key(2, depth, "\"shape\": ");
  out.open_array();
  for (std::size_t k = 0; k < s.shape.size(); ++k) {
    out.item(k, depth + 1);
    out.integer(s.shape[k]);
  }
  out.close_array(s.shape.size(), depth + 1);
  out.plain_key(3, depth, "\"Max\": ");
  write_stat(out, s.stats.max);
  out.plain_key(4, depth, "\"Min\": ");
  write_stat(out, s.stats.min);
  out.plain_key(5, depth, "\"Mean\": ");
  write_stat(out, s.stats.mean);
  out.plain_key(6, depth, "\"Norm\": ");
  write_stat(out, s.stats.norm);
  out.plain_key(7, depth, "\"requires_grad\": ");
  out.boolean(s.requires_grad);
  out.close_object(8, depth);
}

// {"type": type, "value": <value()>}: how msprobe writes a plain argument (`type` needs no escaping).
template <class Value>
void write_typed(JsonText& out, std::string_view type, int depth, Value&& value) {
  out.open_object();
  out.plain_key(0, depth, "\"type\": ");
  out.plain_string(type);  // "int", "float", "bool"
  out.plain_key(1, depth, "\"value\": ");
  value();
  out.close_object(2, depth);
}

// A JSON tree as the value at `depth` of the text being written.
inline void write_json_value(JsonText& out, const nlohmann::ordered_json& j, int depth) {
  details::write_tree(out, j, depth);
}

// An entry's body as dump.json shows it (Record::json_of(body, deferred)), at `depth`.
inline void write_body(JsonText& out, const nlohmann::ordered_json& body, const DeferredBody* deferred, int depth) {
  if (!deferred) return write_json_value(out, body, depth);
  if (!body.is_null() && !(body.is_object() && body.empty()))
    return write_json_value(out, Record::json_of(body, deferred), depth);  // both parts, merged as json_of merges them
  out.open_object();
  std::size_t count = 0;
  deferred->write_members(out, depth, count);
  out.close_object(count, depth);
}

inline void write_record_body(JsonText& out, const Record& r, int depth) {
  write_body(out, r.body, r.deferred.get(), depth);
}

}  // namespace torchprobe::io
