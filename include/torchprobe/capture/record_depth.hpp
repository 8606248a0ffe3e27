#pragma once
// How many records of one observer are open on a thread. An observer sees every record's start and
// end, so only the outermost one is a call of the user's; the count belongs to an observer session
// (its epoch): a record still open when the session ended never reports its end, and a count left
// from an earlier session must not hide the first calls of the next one.
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

namespace torchprobe::capture {

struct RecordDepth {
  int value = 0;
  std::uint64_t epoch = 0;

  // A record starts in session `now`; true when it is the outermost one on this thread.
  bool enter(std::uint64_t now) {
    if (epoch != now) *this = RecordDepth{0, now};
    return value++ == 0;
  }
  // A record of session `now` ends (an end of an earlier session's record changes nothing).
  void leave(std::uint64_t now) {
    if (epoch == now && value > 0) --value;
  }
};

// The process-wide state of one kind of global RecordFunction observer. Its callbacks are plain
// functions, so what they share is static: the object they serve (`slot`), the session's epoch
// (moved on each attach, which voids the depths an earlier session left), each thread's depth, and
// the lock that orders attach and detach. `Observer` is the class that inherits it: one set of
// statics per observer class.
template <typename Observer, typename Target>
struct ObserverStatics {
  static RecordDepth& depth() {
    thread_local RecordDepth d;
    return d;
  }
  static std::atomic<std::uint64_t>& epoch() {
    static std::atomic<std::uint64_t> e{1};
    return e;
  }
  static std::shared_ptr<Target>& slot() {
    static std::shared_ptr<Target>* s = new std::shared_ptr<Target>();  // outlives static destruction
    return *s;
  }
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
};

}  // namespace torchprobe::capture
