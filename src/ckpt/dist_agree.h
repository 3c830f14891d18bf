// Small collectives the sharded checkpoint code agrees through, so that every rank takes the
// same branch (commit, fail, skip a damaged checkpoint) and none is left waiting in a
// collective the others skipped. Internal to src/ckpt/dist_*.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "dist/comm.h"

namespace zaya::dist_agree {

// MIN over ranks of v.
int all_reduce_min(Comm& comm, int v);
// Every rank's string, in rank order (sizes all-gathered first, then the bytes).
std::vector<std::string> all_gather_strings(Comm& comm, const std::string& mine);
// root's string on every rank.
std::string broadcast_string(Comm& comm, const std::string& s, int root);
// "" on every rank when no rank has an error; otherwise, on every rank, the error of the
// lowest failing rank (prefixed "rank R: " when there are several ranks).
std::string first_error(Comm& comm, const std::string& local_error);
// Runs this rank's `work` (slow disk work: fsyncs, renames, removals; returns "" or an error
// message; a thrown exception counts as its message) and agrees on the outcome like
// first_error. With several ranks the work runs on a helper thread while the calling thread
// meets the others in one all_reduce every `round_seconds` until every rank's work is done, so
// however long one rank's disk takes, no rank waits inside a single collective for it: the Comm
// watchdog keeps measuring the network, not the storage. An empty `work` does nothing locally.
std::string agree_after_disk_work(Comm& comm, double round_seconds, const std::function<std::string()>& work);

}  // namespace zaya::dist_agree
