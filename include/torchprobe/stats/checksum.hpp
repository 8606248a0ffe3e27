#pragma once
// summary_mode md5 / xor: a fingerprint of a tensor's bytes in its native dtype,
// taken over the bytes Python's t.contiguous().numpy().tobytes() would give. A strided CPU
// tensor is hashed in place, run by run in logical order, without a contiguous copy.
#include <ATen/ATen.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "torchprobe/stats/layout.hpp"
#include "torchprobe/core/probe_guard.hpp"

namespace torchprobe::stats {

// The tensor on the host with the values it represents in memory (lazy conj/neg resolved).
inline at::Tensor host_values(const at::Tensor& t) {
  if (t.device().is_cpu() && !t.is_conj() && !t.is_neg()) return t;
  ProbeGuard guard;
  at::Tensor h = t.device().is_cpu() ? t : t.to(at::kCPU);
  return h.resolve_conj().resolve_neg();
}

// The tensor's bytes as Python's t.numpy().tobytes() sees them: on the host, contiguous.
inline at::Tensor host_contiguous(const at::Tensor& t) {
  const at::Tensor h = host_values(t);
  if (h.is_contiguous()) return h;
  ProbeGuard guard;
  return h.contiguous();
}

namespace details {

// Calls consume(bytes, n) over the tensor's bytes in logical order. Long contiguous runs are
// passed as they lie in memory; short or strided ones are gathered into a small buffer first.
template <class Consume>
void for_each_logical_chunk(const at::Tensor& host, Consume&& consume) {
  const std::size_t element_size = host.element_size();
  if (host.is_contiguous()) {
    consume(static_cast<const unsigned char*>(host.data_ptr()), static_cast<std::size_t>(host.numel()) * element_size);
    return;
  }
  constexpr std::size_t kBufferBytes = 1 << 16;  // a multiple of every element size
  constexpr std::size_t kDirectBytes = 1 << 12;
  alignas(64) unsigned char buffer[kBufferBytes];
  std::size_t filled = 0;
  const StridedRuns runs = logical_runs(host);
  const std::int64_t stride_bytes = runs.run_stride * static_cast<std::int64_t>(element_size);
  for_each_run(runs, 0, runs.elements(), [&](const char* first, std::int64_t count) {
    const auto* p = reinterpret_cast<const unsigned char*>(first);
    if (runs.run_stride == 1 && static_cast<std::size_t>(count) * element_size >= kDirectBytes) {
      if (filled > 0) consume(buffer, filled);
      filled = 0;
      consume(p, static_cast<std::size_t>(count) * element_size);
      return true;
    }
    for (std::int64_t k = 0; k < count; ++k, p += stride_bytes) {
      std::memcpy(buffer + filled, p, element_size);
      filled += element_size;
      if (filled == kBufferBytes) {
        consume(buffer, filled);
        filled = 0;
      }
    }
    return true;
  });
  if (filled > 0) consume(buffer, filled);
}

// XOR of a byte stream read as little-endian 64-bit words, the last one zero-padded. Fed in
// pieces of any length: each byte lands in the word lane of its position in the stream.
class Xor64Stream {
 public:
  void feed(const unsigned char* p, std::size_t n) {
    for (; n > 0 && offset_ % 8 != 0; ++p, --n) add_byte(*p);
    for (; n >= 8; n -= 8, p += 8) {
      std::uint64_t w;
      std::memcpy(&w, p, 8);  // x86 and arm64 hosts are little-endian, as msprobe assumes
      value_ ^= w;
      offset_ += 8;
    }
    for (; n > 0; ++p, --n) add_byte(*p);
  }
  std::uint64_t value() const { return value_; }

 private:
  void add_byte(unsigned char b) {
    value_ ^= static_cast<std::uint64_t>(b) << (8 * (offset_ % 8));
    ++offset_;
  }
  std::uint64_t value_ = 0;
  std::uint64_t offset_ = 0;
};

}  // namespace details

inline std::uint32_t crc32_of(const at::Tensor& t) {
  const at::Tensor h = host_values(t);
  uLong crc = crc32(0L, Z_NULL, 0);
  details::for_each_logical_chunk(h, [&](const unsigned char* p, std::size_t left) {
    while (left > 0) {  // zlib takes uInt lengths: feed it in chunks below 4 GiB
      const uInt chunk = static_cast<uInt>(std::min<std::size_t>(left, std::size_t(1) << 30));
      crc = crc32(crc, p, chunk);
      p += chunk;
      left -= chunk;
    }
  });
  return static_cast<std::uint32_t>(crc & 0xffffffffUL);
}

// msprobe's "md5" is really CRC-32 (zlib), as 8 lowercase hex digits.
inline std::string crc32_hex(const at::Tensor& t) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08lx", static_cast<unsigned long>(crc32_of(t)));
  return buf;
}

// XOR of the bytes read as little-endian 64-bit words, the last one zero-padded.
inline std::uint64_t xor64(const at::Tensor& t) {
  details::Xor64Stream x;
  details::for_each_logical_chunk(host_values(t), [&](const unsigned char* p, std::size_t n) { x.feed(p, n); });
  return x.value();
}

inline std::string xor64_hex(const at::Tensor& t) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(xor64(t)));
  return buf;
}

}  // namespace torchprobe::stats
