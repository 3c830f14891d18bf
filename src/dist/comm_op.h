// The kinds of communicator operation and the one-line description every communicator uses in
// errors and watchdog reports, e.g. "all_reduce #17 (4096 bytes, f32 sum)".
#pragma once
#include <cstdint>
#include <string>

#include "dist/comm.h"

namespace zaya {

enum class CommOpKind { AllReduce, ReduceScatter, AllGather, Broadcast, Barrier, Send, Recv };
const char* comm_op_kind_name(CommOpKind kind);

// detail: the ReduceOp (all_reduce, reduce_scatter) or the root (broadcast); peer and tag for
// send / recv.
std::string describe_comm_op(CommOpKind kind, int64_t seq, int64_t bytes, CommType type, int64_t detail, int peer,
                             int64_t tag);

}  // namespace zaya
