#pragma once
// The .pt file of one tensor: exactly the bytes torch::pickle_save writes (a torch.save zip), which
// Python's torch.load reads back. Streamed into the file, large tensors with direct I/O.
#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "torchprobe/io/direct_file.hpp"
#include "torchprobe/io/files.hpp"

namespace torchprobe::io {

// Where a tensor's bytes start in its .pt file: libtorch's writer puts the storage record
// ("archive/data/0") first, and pads its local zip header (30 bytes + the name) to 64 bytes. The
// snapshot buffers of large tensors are placed at this remainder modulo kDirectAlign, so that the
// bytes go to the disk straight from the snapshot (DirectFile). Were a libtorch version to place
// the record elsewhere, the files would be the same, written through DirectFile's staging copy.
inline constexpr std::size_t kTensorPayloadOffset = 64;

// Writes `tensor` to `path` as the bytes torch::pickle_save(tensor) returns, which Python's
// torch.load (weights_only or not) reads back as an equal tensor. The archive is streamed straight
// into the file instead of being assembled in memory first, with direct I/O for large tensors
// (DirectFile). `tensor` should be a contiguous CPU tensor that owns its storage (the whole storage
// is written). The file appears under its name only once complete (temporary file + rename, no
// fsync: a process crash cannot leave a partial file, a power loss can). Throws IoError naming
// `path` and the OS error; the temporary file is removed. Returns the bytes that went to the disk
// straight from the tensor's memory.
inline std::uint64_t write_tensor_file(const std::string& path, const at::Tensor& tensor, mode_t mode = 0640) {
  const std::size_t slash = path.rfind('/');
  const std::string dir_prefix = slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  static std::atomic<unsigned> counter{0};
  const std::string tmp = dir_prefix + "." + base.substr(0, 200) + ".tmp" + std::to_string(::getpid()) + "." +
                          std::to_string(counter.fetch_add(1));

  // The pickle part is small (sizes, dtype, a reference to the storage): build it first.
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* bytes, std::size_t n) { pickle.insert(pickle.end(), bytes, bytes + n); });
  pickler.protocol();
  pickler.pushIValue(tensor);
  pickler.stop();

  DirectFile file;
  const bool large = tensor.has_storage() && tensor.storage().nbytes() >= DirectFile::kDirectFrom;
  if (const int err = file.create(tmp.c_str(), mode, large)) throw IoError("write tensor file", path, err);
  // The zip writer is never told about a failed write: in some libtorch versions its destructor
  // would then throw. It goes on into the void and the error is raised below.
  auto sink = [&](const void* data, std::size_t n) -> std::size_t {
    file.write(data, n);
    return n;
  };
  try {
    caffe2::serialize::PyTorchStreamWriter zip(sink);
    torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), zip);
    zip.writeEndOfFile();
  } catch (...) {
    file.close();
    ::unlink(tmp.c_str());
    throw;
  }
  int err = file.close();
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    throw IoError("write tensor file", path, err);
  }
  return file.direct_bytes();
}

}  // namespace torchprobe::io
