// File helpers (atomic replace, errors that name path and reason, permissions, safe names) and
// dump_error_info.log.
#include <doctest/doctest.h>
#include "../skip.hpp"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "forked_child.hpp"
#include "torchprobe/io/direct_file.hpp"
#include "torchprobe/io/error_log.hpp"
#include "torchprobe/io/files.hpp"

namespace fs = std::filesystem;
using torchprobe::io::IoError;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/tp_io_XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path, ec);
  }
};

// Sets a umask for the scope so that permission checks see exactly the requested modes.
struct UmaskGuard {
  mode_t old;
  explicit UmaskGuard(mode_t m) : old(::umask(m)) {}
  ~UmaskGuard() { ::umask(old); }
};

std::string read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

mode_t mode_of(const std::string& p) {
  struct stat st;
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

}  // namespace

TEST_CASE("create_directories: nested, idempotent, 0750, errors name the path") {
  UmaskGuard um(0);
  TempDir t;
  const std::string deep = t.path + "/a/b//c/";
  torchprobe::io::create_directories(deep);
  CHECK(fs::is_directory(t.path + "/a/b/c"));
  CHECK(mode_of(t.path + "/a") == 0750);
  CHECK(mode_of(t.path + "/a/b/c") == 0750);
  torchprobe::io::create_directories(t.path + "/a/b/c");  // exists: fine

  std::ofstream(t.path + "/file") << "x";
  try {
    torchprobe::io::create_directories(t.path + "/file/sub");
    FAIL("expected IoError");
  } catch (const IoError& e) {
    CHECK(e.path() == t.path + "/file");
    CHECK(e.error_code() == ENOTDIR);
    CHECK(std::string(e.what()).find(t.path + "/file") != std::string::npos);
    CHECK(std::string(e.what()).find(std::strerror(ENOTDIR)) != std::string::npos);
  }
}

TEST_CASE("write_file_atomic: creates and replaces, 0640, no temporary left") {
  UmaskGuard um(0);
  TempDir t;
  const std::string target = t.path + "/dump.json";
  torchprobe::io::write_file_atomic(target, "first");
  CHECK(read_all(target) == "first");
  CHECK(mode_of(target) == 0640);
  const std::string big(3 << 20, 'z');
  torchprobe::io::write_file_atomic(target, big);
  CHECK(read_all(target) == big);
  torchprobe::io::write_file_atomic(target, "", 0600, false);
  CHECK(read_all(target).empty());
  CHECK(mode_of(target) == 0600);
  CHECK(names_in(t.path) == std::vector<std::string>{"dump.json"});
  {
    UmaskGuard um2(027);  // the umask still applies, as for any created file
    torchprobe::io::write_file_atomic(t.path + "/other", "x", 0666);
    CHECK(mode_of(t.path + "/other") == 0640);
  }
}

TEST_CASE("write_file_atomic: missing directory names the path and the OS error") {
  TempDir t;
  const std::string target = t.path + "/no/such/dir/dump.json";
  try {
    torchprobe::io::write_file_atomic(target, "data");
    FAIL("expected IoError");
  } catch (const IoError& e) {
    CHECK(e.error_code() == ENOENT);
    CHECK(e.path() == target);
    const std::string msg = e.what();
    CHECK(msg.find(target) != std::string::npos);
    CHECK(msg.find("No such file or directory") != std::string::npos);
  }
  CHECK_THROWS_AS(torchprobe::io::write_file_atomic(t.path + "/", "x"), IoError);  // no file name
}

TEST_CASE("write_file_atomic: read-only directory keeps the old file") {
  TempDir t;
  const std::string dir = t.path + "/ro";
  torchprobe::io::create_directories(dir);
  const std::string target = dir + "/dump.json";
  torchprobe::io::write_file_atomic(target, "old");
  REQUIRE(::chmod(dir.c_str(), 0555) == 0);
  // Root ignores permission bits, so the attempt runs as an unprivileged user where possible.
  const tptest::ChildResult r = tptest::in_child([&](std::string& text) {
    if (!tptest::drop_root()) {
      text = "cannot drop root";
      return 77;
    }
    try {
      torchprobe::io::write_file_atomic(target, "new");
    } catch (const IoError& e) {
      text = e.what();
      return e.error_code() == EACCES ? 0 : 2;
    }
    return 1;
  });
  // As root the child drops to nobody first: failing to is a failure, not a skip (CI runs as root).
  CHECK_MESSAGE(r.code == 0, r.text);
  CHECK(r.text.find(target) != std::string::npos);
  CHECK(r.text.find(std::strerror(EACCES)) != std::string::npos);
  CHECK(read_all(target) == "old");
  CHECK(names_in(dir) == std::vector<std::string>{"dump.json"});
}

TEST_CASE("write_file_atomic: a full disk (file size limit) gives IoError and keeps the old file") {
  TempDir t;
  const std::string target = t.path + "/dump.json";
  torchprobe::io::write_file_atomic(target, "previous content");
  const tptest::ChildResult r = tptest::in_child([&](std::string& text) {
    std::signal(SIGXFSZ, SIG_IGN);  // then write() fails with EFBIG, as with ENOSPC on a full disk
    struct rlimit lim = {4096, 4096};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) return 3;
    try {
      torchprobe::io::write_file_atomic(target, std::string(1 << 20, 'x'));
    } catch (const IoError& e) {
      text = e.what();
      return e.error_code() == EFBIG ? 0 : 2;
    }
    return 1;
  });
  CHECK_MESSAGE(r.code == 0, r.text);
  CHECK(r.text.find(target) != std::string::npos);
  CHECK(r.text.find(std::strerror(EFBIG)) != std::string::npos);
  CHECK(read_all(target) == "previous content");
  CHECK(names_in(t.path) == std::vector<std::string>{"dump.json"});  // temporary removed
}

// ---- DirectFile -----------------------------------------------------------------------------

namespace {

using torchprobe::io::DirectFile;
using torchprobe::io::kDirectAlign;

// A buffer whose byte `k` is at an address with remainder `shift` modulo kDirectAlign, filled with
// pseudo-random bytes.
struct Source {
  std::unique_ptr<unsigned char, decltype(&std::free)> block{nullptr, &std::free};
  unsigned char* data = nullptr;
  Source(std::size_t n, std::size_t shift, unsigned seed) {
    block.reset(static_cast<unsigned char*>(
        std::aligned_alloc(kDirectAlign, (n + shift + kDirectAlign) / kDirectAlign * kDirectAlign)));
    REQUIRE(block);
    data = block.get() + shift;
    std::mt19937 rng(seed);
    for (std::size_t k = 0; k < n; ++k) data[k] = static_cast<unsigned char>(rng());
  }
};

}  // namespace

TEST_CASE(
    "DirectFile writes exactly the bytes it is given, in any pieces; large pieces that line up go straight from "
    "memory") {
  TempDir t;
  UmaskGuard um(0);
  const bool direct_io = torchprobe::io::direct_io_supported(t.path);
  MESSAGE("O_DIRECT on " << t.path << ": " << std::string(direct_io ? "accepted" : "refused, ordinary writes only"));
  // Piece sizes; a piece of (at least) 1 MiB comes from memory with the remainder `shift` (modulo
  // the alignment) that the file offset where it lands has, when `lined_up`; else 8 bytes off.
  struct Case {
    const char* what;
    std::vector<std::size_t> pieces;
    bool lined_up;
  };
  const std::vector<Case> cases = {
      {"a zip-like file: header, large record, small records", {30, 34, (3u << 20) + 12, 16, 150, 2, 97, 22}, true},
      {"a large piece not lined up with its offset", {64, (2u << 20) + 100, 40}, false},
      {"a large piece at offset 0, a whole number of blocks", {4u << 20}, true},
      {"two large pieces in a row", {5000, 1u << 20, (1u << 20) + 1, 3}, true},
      {"many small pieces filling the staging buffer several times", std::vector<std::size_t>(3000, 333), true},
      {"a large piece just over the threshold, one byte into a block", {1, (1u << 20) + 4095}, true},
      {"nothing at all", {}, true},
  };
  for (const Case& c : cases) {
    for (bool ask_direct : {true, false}) {
      CAPTURE(c.what);
      CAPTURE(ask_direct);
      std::string expected;
      std::uint64_t expected_direct = 0;
      DirectFile file;
      const std::string path = t.path + "/f.bin";
      REQUIRE(file.create(path.c_str(), 0640, ask_direct) == 0);
      CHECK(file.direct() == (ask_direct && direct_io));
      std::vector<std::unique_ptr<Source>> keep;  // alive until close(): direct writes read them then
      unsigned seed = 1;
      for (std::size_t n : c.pieces) {
        const std::size_t offset = expected.size();
        const std::size_t shift = (offset + (c.lined_up ? 0 : 8)) % kDirectAlign;
        keep.push_back(std::make_unique<Source>(n, shift, seed++));
        const unsigned char* p = keep.back()->data;
        if (file.direct() && n >= DirectFile::kDirectFrom && c.lined_up) {
          const std::size_t head = (kDirectAlign - offset % kDirectAlign) % kDirectAlign;
          expected_direct += (n - head) / kDirectAlign * kDirectAlign;
        }
        file.write(p, n);
        expected.append(reinterpret_cast<const char*>(p), n);
      }
      CHECK(file.close() == 0);
      CHECK(file.direct_bytes() == expected_direct);
      CHECK(fs::file_size(path) == expected.size());
      CHECK(read_all(path) == expected);
      CHECK(mode_of(path) == 0640);
      fs::remove(path);
    }
  }
}

TEST_CASE("DirectFile: a full disk (file size limit) during a direct write is an error, not a crash") {
  TempDir t;
  const std::string path = t.path + "/f.bin";
  const tptest::ChildResult r = tptest::in_child([&](std::string& text) {
    std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {64 * 1024, 64 * 1024};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) return 3;
    Source src(4u << 20, 64, 7);
    DirectFile file;
    if (file.create(path.c_str(), 0640, true) != 0) return 4;
    const unsigned char header[64] = {};
    file.write(header, sizeof header);  // a header, then the large piece lined up with its offset
    file.write(src.data, 4u << 20);
    const int err = file.close();
    text = std::strerror(err);
    return err == EFBIG ? 0 : 1;
  });
  CHECK_MESSAGE(r.code == 0, r.text);
}

TEST_CASE("DirectFile on a file system without O_DIRECT (ramfs) writes ordinarily and leaves no stray file" *
          TP_NEEDS("root")) {
  TempDir t;
  const std::string mnt = t.path + "/ramfs";
  REQUIRE(::mkdir(mnt.c_str(), 0700) == 0);
  if (::mount("none", mnt.c_str(), "ramfs", 0, nullptr) != 0) {
    TP_SKIP("cannot mount a ramfs here (" << std::strerror(errno) << "; needs root)");
  }
  struct Unmount {
    std::string dir;
    ~Unmount() { ::umount(dir.c_str()); }
  } unmount{mnt};
  CHECK_FALSE(torchprobe::io::direct_io_supported(mnt));
  CHECK(names_in(mnt).empty());  // the refused probe file was removed
  Source src(3u << 20, 64, 11);
  const unsigned char header[64] = {1, 2, 3};
  DirectFile file;
  const std::string path = mnt + "/f.bin";
  REQUIRE(file.create(path.c_str(), 0640, true) == 0);  // Linux created the file, then refused O_DIRECT
  CHECK_FALSE(file.direct());
  file.write(header, sizeof header);
  file.write(src.data, 3u << 20);
  CHECK(file.close() == 0);
  CHECK(file.direct_bytes() == 0);
  std::string expected(reinterpret_cast<const char*>(header), sizeof header);
  expected.append(reinterpret_cast<const char*>(src.data), 3u << 20);
  CHECK(read_all(path) == expected);
  CHECK(names_in(mnt) == std::vector<std::string>{"f.bin"});
}

TEST_CASE("safe_component") {
  using torchprobe::io::safe_component;
  for (const char* ok : {"Aten.add_.0.forward.input.0.pt", "Module.layers.0.Linear.forward.0.output.0.pt",
                         "Functional.relu.0.backward.input.0.pt", "dump.json", "a-b", "..x", "x.."}) {
    CHECK(safe_component(ok) == ok);
  }
  CHECK(safe_component("../x") == ".._x");
  CHECK(safe_component("a/b") == "a_b");
  CHECK(safe_component("..") == "_..");
  CHECK(safe_component(".") == "_.");
  CHECK(safe_component("") == "_");
  CHECK(safe_component("-rf") == "_-rf");
  CHECK(safe_component(std::string("a\0b", 3)) == "a_b");
  const std::string long1 = "Module." + std::string(300, 'm') + ".forward.0.input.0.pt";
  const std::string long2 = "Module." + std::string(300, 'm') + ".forward.0.input.1.pt";
  CHECK(safe_component(long1).size() == 255);
  CHECK(safe_component(long1).substr(252) == ".pt");
  CHECK(safe_component(long1) != safe_component(long2));
  for (const std::string& s : {safe_component("../x"), safe_component(long1), safe_component("/")}) {
    CHECK(s.find('/') == std::string::npos);
    CHECK(s != ".");
    CHECK(s != "..");
    CHECK(s.front() != '-');
  }
}

TEST_CASE("path_is_writable_dir") {
  TempDir t;
  std::string why = "unchanged";
  CHECK(torchprobe::io::path_is_writable_dir(t.path, &why));
  CHECK(why.empty());
  CHECK_FALSE(torchprobe::io::path_is_writable_dir(t.path + "/missing", &why));
  CHECK(why.find("No such file or directory") != std::string::npos);
  std::ofstream(t.path + "/f") << "x";
  CHECK_FALSE(torchprobe::io::path_is_writable_dir(t.path + "/f", &why));
  CHECK(why.find("is not a directory") != std::string::npos);
  CHECK_FALSE(torchprobe::io::path_is_writable_dir(t.path + "/f"));
}

TEST_CASE("ErrorLog: format, deduplication per (what, kind), reset, directory change") {
  TempDir t;
  torchprobe::io::ErrorLog log(t.path + "/rank0");  // created on first use
  const std::string file = t.path + "/rank0/dump_error_info.log";
  CHECK(log.path() == file);
  CHECK_FALSE(fs::exists(file));  // nothing written until there is an error

  CHECK(log.log("forward_input_data_collect", "Aten.add.0.forward", "std::runtime_error", "bad dtype"));
  CHECK_FALSE(log.log("forward_input_data_collect", "Aten.add.1.forward", "std::runtime_error", "again"));
  CHECK(log.log("forward_input_data_collect", "Aten.mul.0.forward", "std::bad_alloc", "out of memory"));
  CHECK(log.log("backward_data_collect", "Aten.add.0.backward", "std::runtime_error", "bad grad"));

  const std::string text = read_all(file);
  const std::string head = R"(\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} [+-]\d{4}\] \[ERROR\] )";
  const std::string pid = std::to_string(::getpid());
  const std::regex expected(
      head + R"(forward_input_data_collect failed: name=Aten\.add\.0\.forward, pid=)" + pid + "\nbad dtype\n\n" + head +
      R"(forward_input_data_collect failed: name=Aten\.mul\.0\.forward, pid=)" + pid + "\nout of memory\n\n" + head +
      R"(backward_data_collect failed: name=Aten\.add\.0\.backward, pid=)" + pid + "\nbad grad\n\n");
  CHECK_MESSAGE(std::regex_match(text, expected), text);
  CHECK(mode_of(file) == (0640 & ~[] {
          mode_t m = ::umask(0);
          ::umask(m);
          return m;
        }()));

  log.reset();  // next step: reported again
  CHECK(log.log("forward_input_data_collect", "Aten.add.5.forward", std::runtime_error("boom")));
  CHECK_FALSE(log.log("forward_input_data_collect", "Aten.add.6.forward", std::runtime_error("boom 2")));
  const std::string after = read_all(file);
  CHECK(after.substr(0, text.size()) == text);  // appended
  CHECK(after.find("name=Aten.add.5.forward, pid=" + pid + "\nboom\n\n") != std::string::npos);

  log.set_directory(t.path + "/step1/rank0");
  CHECK(log.directory() == t.path + "/step1/rank0");
  log.reset();
  CHECK(log.log("forward_output_data_collect", "Aten.relu.0.forward", "std::runtime_error", "x"));
  CHECK(fs::exists(t.path + "/step1/rank0/dump_error_info.log"));
}

TEST_CASE("ErrorLog: an unwritable log falls back to one stderr line and never throws") {
  TempDir t;
  std::ofstream(t.path + "/not_a_dir") << "x";
  torchprobe::io::ErrorLog log(t.path + "/not_a_dir");  // the log would go *inside* a file

  // Catch fd 2 in a file for the duration of the call.
  const std::string captured = t.path + "/stderr.txt";
  std::fflush(stderr);
  const int saved = ::dup(STDERR_FILENO);
  const int cap = ::open(captured.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  REQUIRE(saved >= 0);
  REQUIRE(cap >= 0);
  ::dup2(cap, STDERR_FILENO);
  bool written = false;
  CHECK_NOTHROW(written = log.log("forward_input_data_collect", "Aten.add.0.forward", "E", "line1\nline2"));
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  ::close(cap);

  CHECK(written);
  const std::string err = read_all(captured);
  CHECK(err.find(t.path + "/not_a_dir/dump_error_info.log") != std::string::npos);
  CHECK(err.find("Not a directory") != std::string::npos);
  CHECK(err.find("name=Aten.add.0.forward") != std::string::npos);
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
}
