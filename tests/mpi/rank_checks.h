// Failure reporting shared by the MPI check programs (comm_check, dist_ckpt_check): expect()
// prints a failed check as "<program>: rank <r>: FAILED: <what>" on stderr and counts it in
// g_failures. Each program names itself in g_program and sets g_rank once it knows its rank,
// and turns the count into its exit status.
#pragma once
#include <cstdio>
#include <string>

namespace zaya::rank_checks {

inline const char* g_program = "check";
inline int g_rank = 0;
inline int g_failures = 0;

inline void expect(bool ok, const std::string& what) {
  if (ok) return;
  ++g_failures;
  std::fprintf(stderr, "%s: rank %d: FAILED: %s\n", g_program, g_rank, what.c_str());
}

}  // namespace zaya::rank_checks
