// Expected results for the communicator checks (tests/mpi/comm_check.cpp over MPI,
// tests/gpu/nccl_check.cpp and tests/gpu/test_gpu_comm.cpp over NCCL): the CommType of a C++
// element type, rank-dependent value generators and their exact reductions (integer-valued, so
// sums are exact in any order), per-rank counts and offsets, and the all_reduce cases both
// process checks run, each on its own kind of buffer.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dist/comm.h"

namespace zaya::comm_expect {

template <class T>
CommType type_of();
template <> inline CommType type_of<float>() { return CommType::F32; }
template <> inline CommType type_of<double>() { return CommType::F64; }
template <> inline CommType type_of<int32_t>() { return CommType::I32; }
template <> inline CommType type_of<int64_t>() { return CommType::I64; }
template <> inline CommType type_of<uint8_t>() { return CommType::U8; }

template <class T>
T combine(T a, T b, ReduceOp op) {
  if (op == ReduceOp::Sum) return static_cast<T>(a + b);
  if (op == ReduceOp::Max) return a > b ? a : b;
  return a < b ? a : b;
}

// Rank r's value at index i.
template <class T>
using Gen = std::function<T(int r, int64_t i)>;

// The reduction over ranks 0..size-1 of gen at index i.
template <class T>
T reduced(const Gen<T>& gen, int size, int64_t i, ReduceOp op) {
  T v = gen(0, i);
  for (int r = 1; r < size; ++r) v = combine(v, gen(r, i), op);
  return v;
}

// Per-rank counts 3r + 2 with a zero at zero_rank.
inline std::vector<int64_t> uneven_counts(int size, int zero_rank) {
  std::vector<int64_t> counts(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) counts[static_cast<size_t>(r)] = r == zero_rank ? 0 : 3 * r + 2;
  return counts;
}

// Exclusive prefix sums: rank r's block starts at offsets[r]; offsets.back() is the total.
inline std::vector<int64_t> offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> off(counts.size() + 1, 0);
  for (size_t r = 0; r < counts.size(); ++r) off[r + 1] = off[r] + counts[r];
  return off;
}

// Calls check(name, n, op, in_place, gen) for every all_reduce case: each element type and
// reduction, in place and not, and zero elements. `check` is a generic lambda that deduces T
// from the Gen<T> it is given.
template <class Check>
void for_each_all_reduce_case(Check&& check) {
  check("all_reduce f32 sum", 1000, ReduceOp::Sum, false,
        Gen<float>([](int r, int64_t i) { return static_cast<float>(r * 7 + i % 13); }));
  check("all_reduce f32 max in place", 777, ReduceOp::Max, true,
        Gen<float>([](int r, int64_t i) { return static_cast<float>((r * 31 + i) % 17) - 8.0f; }));
  check("all_reduce f64 sum in place", 1001, ReduceOp::Sum, true,
        Gen<double>([](int r, int64_t i) { return static_cast<double>((r + 1) * i); }));
  check("all_reduce i32 min", 300, ReduceOp::Min, false,
        Gen<int32_t>([](int r, int64_t i) { return static_cast<int32_t>((r * 5 + i) % 11) - 5; }));
  check("all_reduce i64 sum", 500, ReduceOp::Sum, false,
        Gen<int64_t>([](int r, int64_t i) { return (int64_t(r) << 40) + i * 3 + r; }));
  check("all_reduce i64 max in place", 64, ReduceOp::Max, true,
        Gen<int64_t>([](int r, int64_t i) { return -(int64_t(r + 1) << 35) + i; }));
  check("all_reduce u8 min", 257, ReduceOp::Min, false,
        Gen<uint8_t>([](int r, int64_t i) { return static_cast<uint8_t>((r * 13 + i) % 200); }));
  check("all_reduce u8 max in place", 257, ReduceOp::Max, true,
        Gen<uint8_t>([](int r, int64_t i) { return static_cast<uint8_t>((r * 29 + i) % 251); }));
  check("all_reduce of zero elements", 0, ReduceOp::Sum, false, Gen<float>([](int, int64_t) { return 0.0f; }));
}

}  // namespace zaya::comm_expect
