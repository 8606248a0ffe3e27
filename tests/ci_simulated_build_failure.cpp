// Compiled only with -DTORCHPROBE_CI_SIMULATE_BUILD_FAILURE=ON: .ci/run's self-check uses it to
// show that a build failure stops CI.
#error "TORCHPROBE_CI_SIMULATE_BUILD_FAILURE: simulated build failure (.ci/run's self-check)"
