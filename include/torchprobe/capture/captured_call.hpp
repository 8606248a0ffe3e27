#pragma once
// An API call's arguments and results as the training thread captures them under the statistics
// task: tensors as TensorSummary (their statistics are computed now, the JSON item is not built),
// plain values (numbers, strings, dtypes, int lists) as the IValue itself, encoded when written.
// The entry's JSON is built from this when the step is written, or when the journal needs the line.
//
// Building a JSON tree per tensor was most of the probe's cost on small ops: about 25 allocations
// and frees per call, for a tree that a NullSink throws away and a DirectorySink writes once.
#include <ATen/core/ivalue.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <optional>
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
//
// An open step holds one per call, so the items are kept as bytes, each in the fewest that hold
// it: a tensor's summary (dtype, shape, four statistics) and a scalar (None, bool, int, float) are
// encoded in `bytes_`; other values (strings, lists, devices, JSON trees) stay in `boxed_`, which
// the byte stream indexes. A small call's items take about 50 bytes a tensor instead of 152 a slot.
class CapturedCall final : public DeferredBody {
 public:
  enum class Section : std::uint8_t { Arg, Kwarg, Output };
  // One item as it is handed in and read back.
  struct Item {
    Section section = Section::Arg;
    const std::string* name = nullptr;  // a keyword argument's schema name (OpInfo lives for the process)
    CapturedValue value;
  };

  bool has_inputs = false;
  bool has_outputs = false;

  // Items are added in call order: inputs, then outputs.
  void add(Item item) {
    const CapturedValue& v = item.value;
    if (v.form() == CapturedValue::Form::Summary && v.tensor().shape.size() < 256)
      return add_summary(item.section, item.name, v.kind, v.tensor());
    if (v.form() == CapturedValue::Form::Plain) {
      const c10::IValue& x = v.value();
      const std::uint8_t code = scalar_code(x);
      if (code != kNotScalar) {
        put_header(item.section, Form::Scalar, item.name, v.kind);
        put(code);
        if (code == kBool) put(static_cast<std::uint8_t>(x.toBool()));
        if (code == kInt) put(x.toInt());
        if (code == kDouble) put(x.toDouble());
        return;
      }
    }
    put_header(item.section, Form::Boxed, item.name, v.kind);
    put(static_cast<std::uint32_t>(boxed_.size()));
    boxed_.push_back(std::move(item.value));
  }
  void add_summary(Section section, const std::string* name, ArgKind kind, const TensorSummary& s) {
    put_header(section, Form::Summary, name, kind);
    put(static_cast<std::int8_t>(s.dtype));
    put(static_cast<std::uint8_t>(s.requires_grad));
    put(static_cast<std::uint8_t>(s.shape.size()));
    for (std::int64_t d : s.shape) put(d);
    for (const StatValue* v : {&s.stats.max, &s.stats.min, &s.stats.mean, &s.stats.norm}) {
      put(static_cast<std::uint8_t>(v->kind));
      put(v->i);  // the union's eight bytes, whichever member is set
    }
  }
  // The bytes add() or add_summary() will take for `v` (a tensor as a summary): reserved for a
  // call's inputs and its likely output, the bytes are allocated once, at about their size.
  static std::size_t encoded_size(const c10::IValue& v, bool named) {
    const std::size_t header = 2 + (named ? sizeof(const std::string*) : 0);
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      return header + summary_bytes(t.defined() ? static_cast<std::size_t>(t.dim()) : 0);
    }
    const std::uint8_t code = scalar_code(v);
    if (code == kNotScalar) return header + sizeof(std::uint32_t);
    return header + 1 + scalar_payload(code);
  }
  void reserve(std::size_t bytes) { bytes_.reserve(bytes); }
  // The step keeps this body until it is written: give back room that growing it left spare.
  void release_spare() {
    if (bytes_.capacity() - bytes_.size() > 64) bytes_.shrink_to_fit();
    boxed_.shrink_to_fit();
  }

  // Calls visit(section, name, const CapturedValue&) for every item (of section `only` when given),
  // in call order.
  template <class Visit>
  void for_each(Visit&& visit, std::optional<Section> only = std::nullopt) const {
    CapturedValue decoded;
    std::size_t at = 0;
    while (at < bytes_.size()) {
      const auto header = get<std::uint8_t>(at);
      const auto section = static_cast<Section>(header & 3);
      const auto form = static_cast<Form>((header >> 2) & 3);
      const std::string* name = (header & kNamed) ? get<const std::string*>(at) : nullptr;
      const auto kind = static_cast<ArgKind>(get<std::uint8_t>(at));
      const bool wanted = !only || *only == section;
      if (form == Form::Boxed) {
        const auto index = get<std::uint32_t>(at);
        if (wanted) visit(section, name, boxed_[index]);
        continue;
      }
      if (!wanted) {  // skipped without decoding
        if (form == Form::Summary)
          at += summary_bytes(static_cast<std::uint8_t>(bytes_[at + 2]));  // dims after dtype, requires_grad
        else
          at += scalar_payload(get<std::uint8_t>(at));
        continue;
      }
      decoded.kind = kind;
      if (form == Form::Summary) {
        TensorSummary& s = decoded.make_summary();
        s.dtype = static_cast<at::ScalarType>(get<std::int8_t>(at));
        s.requires_grad = get<std::uint8_t>(at) != 0;
        s.shape.resize(get<std::uint8_t>(at));
        for (std::int64_t& d : s.shape) d = get<std::int64_t>(at);
        for (StatValue* v : {&s.stats.max, &s.stats.min, &s.stats.mean, &s.stats.norm}) {
          v->kind = static_cast<StatValue::Kind>(get<std::uint8_t>(at));
          v->i = get<std::int64_t>(at);
        }
      } else {
        switch (get<std::uint8_t>(at)) {
          case kBool: decoded.set_plain(c10::IValue(get<std::uint8_t>(at) != 0)); break;
          case kInt: decoded.set_plain(c10::IValue(get<std::int64_t>(at))); break;
          case kDouble: decoded.set_plain(c10::IValue(get<double>(at))); break;
          default: decoded.set_plain(c10::IValue()); break;
        }
      }
      visit(section, name, static_cast<const CapturedValue&>(decoded));
    }
  }

  void append_to(nlohmann::ordered_json& body) const override {
    if (body.is_null()) body = nlohmann::ordered_json::object();
    // Reserved: an ordered_json object that grows copies its values (its keys are const).
    body.get_ref<nlohmann::ordered_json::object_t&>().reserve(body.size() + 3);
    if (has_inputs) {
      nlohmann::ordered_json args = nlohmann::ordered_json::array();
      nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
      for_each([&](Section section, const std::string* name, const CapturedValue& v) {
        if (section == Section::Arg)
          args.push_back(v.to_json());
        else if (section == Section::Kwarg)
          kwargs[*name] = v.to_json();
      });
      body["input_args"] = std::move(args);
      body["input_kwargs"] = std::move(kwargs);
    }
    if (has_outputs) {
      nlohmann::ordered_json out = nlohmann::ordered_json::array();
      for_each([&](Section, const std::string*, const CapturedValue& v) { out.push_back(v.to_json()); },
               Section::Output);
      body["output"] = std::move(out);
    }
  }

  // Each item with the pointer append_to() gives it; scalars and strings hold no tensor and are
  // not shown.
  void visit_items(DeferredItems& to) const override {
    std::size_t arg = 0, out = 0;
    for_each([&](Section section, const std::string* name, const CapturedValue& v) {
      const std::string pointer = section == Section::Arg     ? "/input_args/" + std::to_string(arg++)
                                  : section == Section::Kwarg ? "/input_kwargs/" + pointer_token(*name)
                                                              : "/output/" + std::to_string(out++);
      if (v.form() == CapturedValue::Form::Summary)
        to.summary(pointer, section == Section::Output, v.tensor());
      else if (v.form() == CapturedValue::Form::Json)
        to.json(pointer, section == Section::Output, v.json());
    });
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
  enum class Form : std::uint8_t { Summary, Scalar, Boxed };
  static constexpr std::uint8_t kNamed = 16;
  enum : std::uint8_t { kNone, kBool, kInt, kDouble, kNotScalar };

  // The bytes after an item's header: a summary of `dims` dimensions (dtype, requires_grad, dims,
  // shape, four statistics each with its kind); a scalar's value after its code.
  static std::size_t summary_bytes(std::size_t dims) {
    return 3 + sizeof(std::int64_t) * dims + 4 * (1 + sizeof(std::int64_t));
  }
  static std::size_t scalar_payload(std::uint8_t code) {
    return code == kBool ? 1 : code == kNone ? 0 : sizeof(std::int64_t);
  }

  static std::uint8_t scalar_code(const c10::IValue& v) {
    if (v.isNone()) return kNone;
    if (v.isBool()) return kBool;
    if (v.isInt()) return kInt;
    if (v.isDouble()) return kDouble;
    return kNotScalar;
  }

  void put_header(Section section, Form form, const std::string* name, ArgKind kind) {
    put(static_cast<std::uint8_t>(static_cast<unsigned>(section) | static_cast<unsigned>(form) << 2 |
                                  (name ? kNamed : 0u)));
    if (name) put(name);
    put(static_cast<std::uint8_t>(kind));
  }
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const char*>(&v);
    bytes_.append(p, sizeof(T));
  }
  template <class T>
  T get(std::size_t& at) const {
    T v;
    std::memcpy(&v, bytes_.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }

  // input_args and output are lists, input_kwargs an object keyed by the arguments' names.
  void write_section(io::JsonText& out, Section section, int depth) const {
    const bool keyed = section == Section::Kwarg;
    keyed ? out.open_object() : out.open_array();
    std::size_t n = 0;
    for_each(
        [&](Section, const std::string* name, const CapturedValue& v) {
          keyed ? out.key(n, depth, *name) : out.item(n, depth);
          ++n;
          v.write(out, depth + 1);
        },
        section);
    keyed ? out.close_object(n, depth) : out.close_array(n, depth);
  }

  std::string bytes_;                 // the encoded items (a byte string: std::string for its growth)
  std::vector<CapturedValue> boxed_;  // the values that have no byte form, in order
};

}  // namespace torchprobe::capture
