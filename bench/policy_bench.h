// expert-bench policy (policy_bench.cpp): an expertd trace replayed through the daemon's cache
// policies, the policy lab's and the offline optimum (Belady) at several cache sizes.
#pragma once

#include <string>
#include <vector>

// Per-layer expert popularity, then each policy's hit rate at each fraction of the trace's
// experts; the last line is ratio=<lfru / belady at the last size>. 1 on a bad trace.
int bench_policy(const std::string& path, const std::vector<double>& fractions);
