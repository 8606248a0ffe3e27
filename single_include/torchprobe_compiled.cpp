// TorchProbe 0.1.0 -- the compiled library of the single-header edition
//
// GENERATED FILE, DO NOT EDIT. tools/make_single_include.py writes it beside torchprobe.hpp.
//
// Compile this one file into your program (or a library of yours), with torchprobe.hpp next to it
// and the same flags as the files that include torchprobe.hpp, and define TORCHPROBE_COMPILED_LIB
// for every one of them and this one (-DTORCHPROBE_COMPILED_LIB=1). Your files then parse the
// debuggers' faces only and compile in seconds; the built-in debuggers and PrecisionDebugger are
// compiled here, once (minutes, and about 3 GB of the compiler's memory). docs/packaging.md.
#if !defined(TORCHPROBE_COMPILED_LIB)
#error "define TORCHPROBE_COMPILED_LIB for this file and for every file that includes torchprobe.hpp"
#endif
#define TORCHPROBE_INCLUDE_IMPLEMENTATION 1
#include "torchprobe.hpp"

TORCHPROBE_COMPILED_DEBUGGERS(TORCHPROBE_DEFINE_COMPILED)
TORCHPROBE_DEFINE_COMPILED_PRECISION_DEBUGGER
