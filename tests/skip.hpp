#pragma once
// A skip that CI can see: doctest has no "skipped" state for a test that finds at run time that it
// cannot run here (no GPU, not root, no ramfs), so such a test prints one line that starts with
// "SKIPPED:" and returns. .ci/run counts these lines and prints the total.
#include <doctest/doctest.h>

#define TP_SKIP(reason)             \
  do {                              \
    MESSAGE("SKIPPED: " << reason); \
    return;                         \
  } while (false)
