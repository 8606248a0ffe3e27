#pragma once
// Helpers shared by the libtorch tests: temporary directories and running python3 as an
// independent reader of what TorchProbe wrote.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace tptest {

// Runs `python3 -c code` (the python3 that has torch), returns its stdout; exit status in *rc.
inline std::string run_python(const std::string& code, int* rc = nullptr) {
  const std::filesystem::path script =
      std::filesystem::temp_directory_path() / ("tp_py_" + std::to_string(::getpid()) + "_" + std::to_string(std::rand()) + ".py");
  { std::ofstream(script) << code; }
  const std::string cmd = std::string(TORCHPROBE_PYTHON) + " " + script.string() + " 2>&1";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p) {
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    const int status = ::pclose(p);
    if (rc) *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  } else if (rc) {
    *rc = -1;
  }
  std::filesystem::remove(script);
  return out;
}

// A fresh directory under /tmp, removed when the object goes.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "torchprobe_test_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& rel) const { return path_ + "/" + rel; }

 private:
  std::string path_;
};

inline nlohmann::ordered_json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::ordered_json::parse(ss.str(), nullptr, true, /*ignore_comments=*/false);
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace tptest
