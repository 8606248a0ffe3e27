#pragma once
// A nlohmann JSON tree written exactly as Python's json module writes it (io/json_text.hpp has the
// rules). nlohmann's own dump() differs (NaN becomes null, its own float layout and indentation),
// so the tree is walked here.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include "torchprobe/io/json_text.hpp"

namespace torchprobe::io {

namespace details {

// Walks one nlohmann tree into a JsonText.
template <class Json>
void write_tree(JsonText& out, const Json& j, int depth) {
  using T = nlohmann::detail::value_t;
  switch (j.type()) {
    case T::null: out.null(); break;
    case T::boolean: out.boolean(j.template get<bool>()); break;
    case T::number_integer: out.integer(j.template get<std::int64_t>()); break;
    case T::number_unsigned: out.integer(j.template get<std::uint64_t>()); break;
    case T::number_float: out.real(j.template get<double>()); break;
    case T::string: out.string(j.template get_ref<const std::string&>()); break;
    case T::array: {
      out.open_array();
      std::size_t i = 0;
      for (const auto& item : j) {
        out.item(i++, depth);
        write_tree(out, item, depth + 1);
        out.maybe_drain();
      }
      out.close_array(i, depth);
      break;
    }
    case T::object: {
      out.open_object();
      std::size_t i = 0;
      for (auto it = j.begin(); it != j.end(); ++it) {
        out.key(i++, depth, it.key());
        write_tree(out, it.value(), depth + 1);
        out.maybe_drain();
      }
      out.close_object(i, depth);
      break;
    }
    case T::binary:
      // Python has no such value; silently inventing a layout would make files no reader expects.
      throw std::invalid_argument("torchprobe: binary JSON values cannot be written as Python JSON");
    case T::discarded: throw std::invalid_argument("torchprobe: a discarded JSON value cannot be written");
  }
}

// Hands chunks of text to an ostream.
class StreamDrain final : public TextDrain {
 public:
  explicit StreamDrain(std::ostream& os) : os_(os) {}
  void take(std::string_view text) override { os_.write(text.data(), static_cast<std::streamsize>(text.size())); }

 private:
  std::ostream& os_;
};

template <class Json>
void write_python_json_impl(std::ostream& os, const Json& j, int indent) {
  std::string buf;
  StreamDrain drain(os);
  JsonText out(buf, indent, &drain);
  write_tree(out, j, 0);
  out.drain();
}

template <class Json>
std::string to_python_json_impl(const Json& j, int indent) {
  std::string buf;
  JsonText out(buf, indent);
  write_tree(out, j, 0);
  out.finish();
  return buf;
}

}  // namespace details

// Same bytes as Python's json.dump(obj, f, indent=indent) (no trailing newline, like Python).
// indent >= 0 is Python's integer indent (0 = newlines without indentation); a negative indent
// stands for indent=None: one line with ", " and ": " separators, as plain json.dumps(obj).
inline void write_python_json(std::ostream& os, const nlohmann::ordered_json& j, int indent = 1) {
  details::write_python_json_impl(os, j, indent);
}
// Other nlohmann::basic_json flavours (e.g. nlohmann::json); exact types only, so that values that
// merely convert to JSON pick the ordered_json overload above instead of being ambiguous.
template <class Json, std::enable_if_t<nlohmann::detail::is_basic_json<Json>::value, int> = 0>
void write_python_json(std::ostream& os, const Json& j, int indent = 1) {
  details::write_python_json_impl(os, j, indent);
}

inline std::string to_python_json(const nlohmann::ordered_json& j, int indent = 1) {
  return details::to_python_json_impl(j, indent);
}
template <class Json, std::enable_if_t<nlohmann::detail::is_basic_json<Json>::value, int> = 0>
std::string to_python_json(const Json& j, int indent = 1) {
  return details::to_python_json_impl(j, indent);
}

}  // namespace torchprobe::io
