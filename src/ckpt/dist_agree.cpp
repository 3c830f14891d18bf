// Agreement collectives for sharded checkpoints (see dist_agree.h).
#include "ckpt/dist_agree.h"

#include <chrono>
#include <cstdint>
#include <exception>
#include <future>
#include <numeric>
#include <system_error>

#include "core/error.h"

namespace zaya::dist_agree {

int all_reduce_min(Comm& comm, int v) {
  int32_t in = v, out = v;
  comm.all_reduce(&in, &out, 1, CommType::I32, ReduceOp::Min)->wait();
  return int(out);
}

std::vector<std::string> all_gather_strings(Comm& comm, const std::string& mine) {
  const int n = comm.size();
  int64_t my_size = int64_t(mine.size());
  std::vector<int64_t> sizes(size_t(n), 0);
  comm.all_gather(&my_size, sizes.data(), std::vector<int64_t>(size_t(n), 1), CommType::I64)->wait();
  std::string all(size_t(std::accumulate(sizes.begin(), sizes.end(), int64_t(0))), '\0');
  comm.all_gather(mine.data(), all.data(), sizes, CommType::U8)->wait();
  std::vector<std::string> out;
  size_t pos = 0;
  for (int64_t s : sizes) {
    out.push_back(all.substr(pos, size_t(s)));
    pos += size_t(s);
  }
  return out;
}

std::string broadcast_string(Comm& comm, const std::string& s, int root) {
  int64_t size = int64_t(s.size());
  comm.broadcast(&size, 1, CommType::I64, root)->wait();
  std::string out = comm.rank() == root ? s : std::string(size_t(size), '\0');
  if (size > 0) comm.broadcast(out.data(), size, CommType::U8, root)->wait();
  return out;
}

std::string first_error(Comm& comm, const std::string& local_error) {
  const int n = comm.size();
  const int failing = all_reduce_min(comm, local_error.empty() ? n : comm.rank());
  if (failing >= n) return "";
  std::string msg = broadcast_string(comm, local_error, failing);
  return n > 1 ? "rank " + std::to_string(failing) + ": " + msg : msg;
}

namespace {
std::string run_catching(const std::function<std::string()>& work) {
  if (!work) return "";
  try {
    return work();
  } catch (const Error& e) {
    return e.message();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "disk work failed with an unknown exception";
  }
}
}  // namespace

std::string agree_after_disk_work(Comm& comm, double round_seconds,
                                  const std::function<std::string()>& work) {
  if (comm.size() == 1) return first_error(comm, run_catching(work));
  std::future<std::string> running;
  std::string done_here;  // the work's result when no thread could be started for it
  if (work) {
    try {
      running = std::async(std::launch::async, [&work] { return run_catching(work); });
    } catch (const std::system_error&) {
      done_here = run_catching(work);  // then the others wait for it in one round
    }
  }
  const auto round = std::chrono::duration<double>(round_seconds);
  for (;;) {
    const bool mine_done = !running.valid() || running.wait_for(round) == std::future_status::ready;
    if (all_reduce_min(comm, mine_done ? 1 : 0) == 1) break;
  }
  return first_error(comm, running.valid() ? running.get() : done_here);
}

}  // namespace zaya::dist_agree
