#pragma once
// NumPy .npy files of 1-byte elements (bool '|b1', int8 '|i1'), written byte for byte as np.save
// writes them (format 1.0, header padded to 64 bytes with numpy's room to grow the first axis), and
// read back by the grad-compare tool.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace torchprobe::io {

// Python's repr() of a shape tuple: "(4, 8)", "(4,)", "()".
inline std::string npy_shape_repr(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

// The header np.save writes for a C-order array of `descr` ("|b1") and `shape`.
inline std::string npy_header(std::string_view descr, const std::vector<std::int64_t>& shape) {
  std::string dict =
      "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': " + npy_shape_repr(shape) + ", }";
  // numpy >= 1.23 leaves room for the first axis to grow to 21 digits (GROWTH_AXIS_MAX_DIGITS).
  if (!shape.empty()) dict.append(21 - std::to_string(shape[0]).size(), ' ');
  const std::size_t hlen = dict.size() + 1;               // with the closing '\n'
  const std::size_t version = hlen + 64 > 65535 ? 2 : 1;  // v2.0 (4-byte length) only for huge headers
  const std::size_t prefix = version == 1 ? 10 : 12;
  const std::size_t pad = 64 - (prefix + hlen) % 64;  // numpy pads a full 64 when already aligned
  const std::size_t total = hlen + pad;
  std::string out = "\x93NUMPY";
  out += static_cast<char>(version);
  out += '\0';
  for (std::size_t i = 0; i < (version == 1 ? 2u : 4u); ++i) out += static_cast<char>((total >> (8 * i)) & 0xff);
  out += dict;
  out.append(pad, ' ');
  out += '\n';
  return out;
}

// A parsed .npy of 1-byte elements: its descr, shape and the raw bytes (C order).
struct NpyBytes {
  std::string descr;
  std::vector<std::int64_t> shape;
  std::string data;
};

// Reads what npy_header wrote (and what np.save writes for bool/int8 arrays); nullopt with *why set
// for anything else (other dtypes, Fortran order, a truncated file).
inline std::optional<NpyBytes> parse_npy(std::string_view file, std::string* why = nullptr) {
  auto fail = [&](const char* reason) -> std::optional<NpyBytes> {
    if (why) *why = reason;
    return std::nullopt;
  };
  if (file.size() < 10 || file.substr(0, 6) != "\x93NUMPY") return fail("not a .npy file");
  const unsigned major = static_cast<unsigned char>(file[6]);
  const std::size_t prefix = major == 1 ? 10 : 12;
  if (major < 1 || major > 3 || file.size() < prefix) return fail("unknown .npy version");
  std::size_t hlen = 0;
  for (std::size_t i = 0; i + 8 < prefix; ++i) hlen |= std::size_t(static_cast<unsigned char>(file[8 + i])) << (8 * i);
  if (file.size() < prefix + hlen) return fail("truncated .npy header");
  const std::string_view header = file.substr(prefix, hlen);
  NpyBytes out;
  const auto d = header.find("'descr': '");
  if (d == std::string_view::npos) return fail("no descr in the .npy header");
  const auto d_end = header.find('\'', d + 10);
  out.descr = std::string(header.substr(d + 10, d_end - d - 10));
  if (out.descr != "|b1" && out.descr != "|i1" && out.descr != "|u1") return fail("not a 1-byte dtype");
  if (header.find("'fortran_order': False") == std::string_view::npos) return fail("Fortran order");
  const auto s = header.find("'shape': (");
  if (s == std::string_view::npos) return fail("no shape in the .npy header");
  // Each size and their product are bounded by the file's length (one byte an element) while they
  // are read: a header from elsewhere may claim sizes no integer holds.
  const std::int64_t most = static_cast<std::int64_t>(file.size());
  std::int64_t count = 1;
  for (std::size_t i = s + 10; i < header.size() && header[i] != ')'; ++i) {
    if (header[i] < '0' || header[i] > '9') continue;
    std::int64_t v = 0;
    while (i < header.size() && header[i] >= '0' && header[i] <= '9') {
      v = v * 10 + (header[i++] - '0');
      if (v > most) return fail("a size in the .npy shape is larger than the file");
    }
    out.shape.push_back(v);
    count = v != 0 && count > most / v ? most + 1 : count * v;
    --i;
  }
  if (file.size() - prefix - hlen < static_cast<std::size_t>(count)) return fail("truncated .npy data");
  out.data = std::string(file.substr(prefix + hlen, static_cast<std::size_t>(count)));
  return out;
}

}  // namespace torchprobe::io
