#pragma once
// Declarations only: Debian's libtorch (1.13, 2.6) ships c10d/ProcessGroupGloo.hpp, and Gloo in
// libtorch_cpu, but not Gloo's headers. The tests create a ProcessGroupGloo through that header;
// these declare just what it names (nothing of Gloo is defined or called inline). Searched after
// the system's include directories (-idirafter), so real Gloo headers win where they exist.
#include <chrono>
#include <string>
#include <vector>

namespace gloo {
class Context;
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
namespace rendezvous {
class Store {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::seconds(30);
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) = 0;
};
}  // namespace rendezvous
}  // namespace gloo
