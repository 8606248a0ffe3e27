#pragma once
// How many records of one observer are open on a thread. An observer sees every record's start and
// end, so only the outermost one is a call of the user's; the count belongs to an observer session
// (its epoch): a record still open when the session ended never reports its end, and a count left
// from an earlier session must not hide the first calls of the next one.
#include <cstdint>

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

}  // namespace torchprobe::capture
