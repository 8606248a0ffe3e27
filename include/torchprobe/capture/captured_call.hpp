#pragma once
// An API call's arguments and results as the training thread captures them under the statistics
// task: tensors as TensorSummary (their statistics are computed now, the JSON item is not built),
// plain values (numbers, strings, dtypes, int lists) as the IValue itself, encoded when written.
// The entry's JSON is built from this when the step is written, or when the journal needs the line.
//
// Building a JSON tree per tensor was most of the probe's cost on small ops: about 25 allocations
// and frees per call, for a tree that a NullSink throws away and a DirectorySink writes once.
#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "torchprobe/core/record.hpp"
#include "torchprobe/capture/op_registry.hpp"
#include "torchprobe/core/tensor_json.hpp"
#include "torchprobe/capture/value_encoder.hpp"
#include "torchprobe/io/json_text.hpp"
#include "torchprobe/io/record_text.hpp"

namespace torchprobe::capture {

// One captured value, in whichever form was cheapest to keep (one at a time: an open step holds
// one of these per argument of every call, so the forms share their storage).
struct CapturedValue {
  enum class Form : std::uint8_t { Json, Summary, Plain };  // in the order of `data`'s alternatives
  // Json: encoded at capture (tensor lists, tensors the task describes itself); Summary: a CPU
  // tensor's statistics item; Plain: a value without tensors, encoded when written.
  std::variant<nlohmann::ordered_json, TensorSummary, c10::IValue> data;
  ArgKind kind = ArgKind::Generic;

  Form form() const { return static_cast<Form>(data.index()); }
  TensorSummary& make_summary() { return data.emplace<TensorSummary>(); }
  void set_plain(const c10::IValue& v) { data.emplace<c10::IValue>(v); }
  void set_json(nlohmann::ordered_json j) { data.emplace<nlohmann::ordered_json>(std::move(j)); }
  const TensorSummary& tensor() const { return std::get<TensorSummary>(data); }
  const c10::IValue& value() const { return std::get<c10::IValue>(data); }
  const nlohmann::ordered_json& json() const { return std::get<nlohmann::ordered_json>(data); }

  // Values that hold no tensor and are cheap to keep as they are. Everything else (lists of
  // tensors, tuples, dicts, objects) is encoded at capture, as before.
  static bool plain(const c10::IValue& v) {
    return v.isNone() || v.isBool() || v.isInt() || v.isDouble() || v.isString() || v.isDevice() || v.isIntList() ||
           v.isDoubleList() || v.isBoolList();
  }

  nlohmann::ordered_json to_json() const {
    switch (form()) {
      case Form::Summary: return tensor_item(tensor());
      case Form::Plain: {
        auto no_tensors = [](const at::Tensor&, const Site&) { return nlohmann::ordered_json(); };
        ValueEncoder<decltype(no_tensors)> encode(no_tensors);
        return encode.encode(value(), kind, Site{});
      }
      case Form::Json: break;
    }
    return json();
  }

  // to_json() as text, at `depth`: the common forms without building a tree.
  void write(io::JsonText& out, int depth) const {
    switch (form()) {
      case Form::Summary: return io::write_tensor_item(out, tensor(), depth);
      case Form::Plain: {
        const c10::IValue& v = value();
        if (v.isNone()) return out.null();
        if (v.isBool()) return io::write_typed(out, "bool", depth, [&] { out.boolean(v.toBool()); });
        if (v.isDouble()) return io::write_typed(out, "float", depth, [&] { out.real(v.toDouble()); });
        if (v.isInt() && kind == ArgKind::Generic)
          return io::write_typed(out, "int", depth, [&] { out.integer(v.toInt()); });
        return io::write_json_value(out, to_json(), depth);
      }
      case Form::Json: break;
    }
    io::write_json_value(out, json(), depth);
  }
};

// The body of an API forward entry: input_args, input_kwargs, output, in msprobe's key order.
class CapturedCall final : public DeferredBody {
 public:
  enum class Section : std::uint8_t { Arg, Kwarg, Output };
  struct Item {
    Section section = Section::Arg;
    const std::string* name = nullptr;  // a keyword argument's schema name (OpInfo lives for the process)
    CapturedValue value;
  };

  c10::SmallVector<Item, 4> items;  // in call order: inputs, then outputs (a small call's fit inline)
  bool has_inputs = false;
  bool has_outputs = false;

  void append_to(nlohmann::ordered_json& body) const override {
    if (body.is_null()) body = nlohmann::ordered_json::object();
    // Reserved: an ordered_json object that grows copies its values (its keys are const).
    body.get_ref<nlohmann::ordered_json::object_t&>().reserve(body.size() + 3);
    if (has_inputs) {
      nlohmann::ordered_json args = nlohmann::ordered_json::array();
      nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
      for (const Item& i : items) {
        if (i.section == Section::Arg)
          args.push_back(i.value.to_json());
        else if (i.section == Section::Kwarg)
          kwargs[*i.name] = i.value.to_json();
      }
      body["input_args"] = std::move(args);
      body["input_kwargs"] = std::move(kwargs);
    }
    if (has_outputs) {
      nlohmann::ordered_json out = nlohmann::ordered_json::array();
      for (const Item& i : items)
        if (i.section == Section::Output) out.push_back(i.value.to_json());
      body["output"] = std::move(out);
    }
  }

  void write_members(io::JsonText& out, int depth, std::size_t& count) const override {
    if (has_inputs) {
      out.plain_key(count++, depth, "\"input_args\": ");
      write_section(out, Section::Arg, depth + 1);
      out.plain_key(count++, depth, "\"input_kwargs\": ");
      write_section(out, Section::Kwarg, depth + 1);
    }
    if (has_outputs) {
      out.plain_key(count++, depth, "\"output\": ");
      write_section(out, Section::Output, depth + 1);
    }
  }

 private:
  // input_args and output are lists, input_kwargs an object keyed by the arguments' names.
  void write_section(io::JsonText& out, Section section, int depth) const {
    const bool keyed = section == Section::Kwarg;
    keyed ? out.open_object() : out.open_array();
    std::size_t n = 0;
    for (const Item& i : items) {
      if (i.section != section) continue;
      keyed ? out.key(n, depth, *i.name) : out.item(n, depth);
      ++n;
      i.value.write(out, depth + 1);
    }
    keyed ? out.close_object(n, depth) : out.close_array(n, depth);
  }
};

}  // namespace torchprobe::capture
