#pragma once
// summary_mode md5 / xor: a fingerprint of a tensor's bytes in its native dtype (reference §5.5).
#include <ATen/ATen.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "../details/probe_guard.hpp"

namespace torchprobe::stats {

// The tensor's bytes as Python's t.numpy().tobytes() sees them: on the host, contiguous.
inline at::Tensor host_contiguous(const at::Tensor& t) {
  ProbeGuard guard;
  at::Tensor h = t.device().is_cpu() ? t : t.to(at::kCPU);
  return h.is_contiguous() ? h : h.contiguous();
}

// msprobe's "md5" is really CRC-32 (zlib), as 8 lowercase hex digits.
inline std::string crc32_hex(const at::Tensor& t) {
  const at::Tensor h = host_contiguous(t);
  const auto* p = static_cast<const Bytef*>(h.data_ptr());
  std::size_t left = h.numel() * h.element_size();
  uLong crc = crc32(0L, Z_NULL, 0);
  while (left > 0) {  // zlib takes uInt lengths: feed it in chunks below 4 GiB
    const uInt chunk = static_cast<uInt>(std::min<std::size_t>(left, 1u << 30));
    crc = crc32(crc, p, chunk);
    p += chunk;
    left -= chunk;
  }
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08lx", static_cast<unsigned long>(crc & 0xffffffffUL));
  return buf;
}

// XOR of the bytes read as little-endian 64-bit words, the last one zero-padded.
inline std::uint64_t xor64(const at::Tensor& t) {
  const at::Tensor h = host_contiguous(t);
  const auto* p = static_cast<const unsigned char*>(h.data_ptr());
  const std::size_t n = h.numel() * h.element_size();
  std::uint64_t acc = 0;
  std::size_t k = 0;
  for (; k + 8 <= n; k += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + k, 8);  // x86 and arm64 hosts are little-endian, as msprobe assumes
    acc ^= w;
  }
  if (k < n) {
    std::uint64_t w = 0;
    std::memcpy(&w, p + k, n - k);
    acc ^= w;
  }
  return acc;
}

inline std::string xor64_hex(const at::Tensor& t) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(xor64(t)));
  return buf;
}

}  // namespace torchprobe::stats
