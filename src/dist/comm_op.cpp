// Names and descriptions of communicator operations (comm_op.h).
#include "dist/comm_op.h"

namespace zaya {
namespace {

const char* reduce_name(int64_t op) {
  switch (static_cast<ReduceOp>(op)) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

}  // namespace

const char* comm_op_kind_name(CommOpKind kind) {
  switch (kind) {
    case CommOpKind::AllReduce: return "all_reduce";
    case CommOpKind::ReduceScatter: return "reduce_scatter";
    case CommOpKind::AllGather: return "all_gather";
    case CommOpKind::Broadcast: return "broadcast";
    case CommOpKind::Barrier: return "barrier";
    case CommOpKind::Send: return "send";
    case CommOpKind::Recv: return "recv";
  }
  return "?";
}

std::string describe_comm_op(CommOpKind kind, int64_t seq, int64_t bytes, CommType type, int64_t detail, int peer,
                             int64_t tag) {
  std::string s = std::string(comm_op_kind_name(kind)) + " #" + std::to_string(seq) + " (" + std::to_string(bytes) +
                  " bytes";
  const std::string t = comm_type_name(type);
  switch (kind) {
    case CommOpKind::AllReduce:
    case CommOpKind::ReduceScatter: s += ", " + t + " " + reduce_name(detail); break;
    case CommOpKind::AllGather: s += ", " + t; break;
    case CommOpKind::Broadcast: s += ", " + t + " from root " + std::to_string(detail); break;
    case CommOpKind::Barrier: break;
    case CommOpKind::Send: s += ", " + t + " to rank " + std::to_string(peer) + " tag " + std::to_string(tag); break;
    case CommOpKind::Recv: s += ", " + t + " from rank " + std::to_string(peer) + " tag " + std::to_string(tag); break;
  }
  return s + ")";
}

}  // namespace zaya
