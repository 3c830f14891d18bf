// Default ownership policy for sharded (format version 2) checkpoints and their reshaping:
// whole tensors are assigned to ranks by greedy longest-processing-time bin packing on a
// cost the caller chooses (default: the element count). Deterministic: the same costs and
// rank count always give the same assignment, on every rank and in `zaya ckpt reshape`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace zaya {

// owner[i] = the rank (0 <= rank < ranks) that owns item i. LPT greedy: items sorted by cost
// descending (ties: lower index first), each given to the currently least-loaded rank (ties:
// lowest rank). Costs must be finite and >= 0; ranks >= 1. Throws zaya::Error otherwise.
std::vector<int> assign_whole_tensors(const std::vector<double>& costs, int ranks);

// The default cost of a tensor: its element count (the product of its shape).
double numel_cost(const std::vector<int64_t>& shape);

}  // namespace zaya
