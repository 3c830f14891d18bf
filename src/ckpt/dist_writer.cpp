// DistCheckpointWriter: staging into bounded host buffers on the training thread, background
// writer threads, and the collective two-phase commit (see dist_checkpoint.h).
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include "ckpt/checksum.h"
#include "ckpt/dist_agree.h"
#include "ckpt/dist_checkpoint.h"
#include "ckpt/dist_io.h"
#include "ckpt/dist_manifest.h"
#include "core/error.h"
#include "dist/comm.h"

namespace fs = std::filesystem;

namespace zaya {

static_assert(std::endian::native == std::endian::little, "rank files are little-endian f32");

namespace {

using Clock = std::chrono::steady_clock;
using dist_io::fail_ckpt;
namespace dm = dist_manifest;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One piece as this rank writes it.
struct LocalPiece {
  std::string name;
  std::vector<int64_t> shape;
  std::string group;
  uint64_t offset = 0, length = 0;
  uint64_t file_offset = 0;          // bytes
  std::vector<uint32_t> chunk_crcs;  // filled by the writer threads
  std::vector<uint64_t> chunk_sizes;
};

}  // namespace

// The save in flight. Fields below `mu` are guarded by the Impl's mutex.
struct DistJob {
  int64_t step = 0;
  std::string root, tmp_name, tmp_dir, file_name, path;
  int fd = -1;
  nlohmann::json meta;
  std::vector<LocalPiece> pieces;
  uint64_t bytes = 0;
  Clock::time_point start;
  DistSaveStats stats;
  // guarded by Impl::mu
  size_t outstanding = 0;  // chunks queued or being written
  bool all_queued = false;
  bool done = false;  // the file is written and fsynced (or the job failed and the file is closed)
  double write_seconds = 0;  // begin_save start -> done
  std::string error;  // the first local failure
};

struct StagedChunk {
  std::shared_ptr<DistJob> job;
  size_t piece = 0, index = 0;
  uint64_t file_offset = 0, bytes = 0;
  std::unique_ptr<char[]> buf;
};

struct DistCheckpointWriter::Impl {
  Comm& comm;
  DistWriterOptions opts;
  uint64_t chunk_bytes = 0;
  size_t max_buffers = 1;
  int test_delay_ms = 0;  // ZAYA_CKPT_TEST_WRITE_DELAY_MS: each chunk write sleeps first

  std::mutex mu;
  std::condition_variable work_cv, space_cv, done_cv;
  std::deque<StagedChunk> queue;
  std::vector<std::unique_ptr<char[]>> free_buffers;
  size_t buffers_in_use = 0;
  bool stopping = false;
  std::vector<std::thread> threads;

  std::shared_ptr<DistJob> job;
  DistSaveStats last;

  Impl(Comm& c, DistWriterOptions o) : comm(c), opts(std::move(o)) {}

  void writer_loop();
  void finalize(DistJob& j);
  std::unique_ptr<char[]> take_buffer();
  void set_error(DistJob& j, const std::string& e) {
    if (j.error.empty()) j.error = e;
  }
  bool local_done() {
    std::lock_guard<std::mutex> lk(mu);
    return job->done;
  }
  std::optional<DistSaveStats> poll();
  DistSaveStats commit();
  [[noreturn]] void fail_job(const std::string& message);
  void discard_job();
};

// ---------------------------------------------------------------------------------------------
// Writer threads

void DistCheckpointWriter::Impl::writer_loop() {
  // Background I/O yields the cores to training: lowest priority for this thread only (Linux
  // applies setpriority to one thread when given its tid). Failure just keeps the priority.
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 19);
  for (;;) {
    StagedChunk c;
    {
      std::unique_lock<std::mutex> lk(mu);
      work_cv.wait(lk, [&] { return stopping || !queue.empty(); });
      if (queue.empty()) return;  // stopping
      c = std::move(queue.front());
      queue.pop_front();
    }
    DistJob& j = *c.job;
    bool skip = false;
    {
      std::lock_guard<std::mutex> lk(mu);
      skip = !j.error.empty() || stopping;
    }
    std::string err;
    if (!skip) {
      if (test_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(test_delay_ms));
      try {
        j.pieces[c.piece].chunk_crcs[c.index] = crc32c(c.buf.get(), size_t(c.bytes));
        dist_io::pwrite_all(j.fd, c.buf.get(), size_t(c.bytes), c.file_offset, j.path);
      } catch (const Error& e) {
        err = e.message();
      } catch (const std::exception& e) {
        err = j.path + ": " + e.what();
      }
    }
    bool last_chunk = false;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (!err.empty()) set_error(j, err);
      free_buffers.push_back(std::move(c.buf));
      --buffers_in_use;
      last_chunk = --j.outstanding == 0 && j.all_queued;
    }
    space_cv.notify_all();
    if (last_chunk) finalize(j);
  }
}

// Runs once per job, after its last chunk: fsync and close the file, mark the job done.
void DistCheckpointWriter::Impl::finalize(DistJob& j) {
  std::string err;
  bool failed = false;
  {
    std::lock_guard<std::mutex> lk(mu);
    failed = !j.error.empty();
  }
  if (j.fd >= 0) {
    if (!failed) {
      try {
        dist_io::fsync_file(j.fd, j.path);
      } catch (const Error& e) {
        err = e.message();
      }
    }
    if (::close(j.fd) != 0 && err.empty() && !failed) err = j.path + ": close failed: " + dist_io::errno_text();
    j.fd = -1;
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    if (!err.empty()) set_error(j, err);
    j.write_seconds = seconds_since(j.start);
    j.done = true;
  }
  done_cv.notify_all();
}

std::unique_ptr<char[]> DistCheckpointWriter::Impl::take_buffer() {
  std::unique_lock<std::mutex> lk(mu);
  space_cv.wait(lk, [&] { return buffers_in_use < max_buffers; });
  ++buffers_in_use;
  if (!free_buffers.empty()) {
    auto b = std::move(free_buffers.back());
    free_buffers.pop_back();
    return b;
  }
  lk.unlock();
  return std::make_unique_for_overwrite<char[]>(size_t(chunk_bytes));
}

// ---------------------------------------------------------------------------------------------
// Construction

DistCheckpointWriter::DistCheckpointWriter(Comm& comm, DistWriterOptions options)
    : impl_(std::make_unique<Impl>(comm, std::move(options))) {
  Impl& m = *impl_;
  if (m.opts.writer_threads < 1 || m.opts.writer_threads > 256)
    fail_ckpt("writer_threads is " + std::to_string(m.opts.writer_threads), "use 1 to 256 writer threads");
  if (m.opts.staging_bytes < 4096)
    fail_ckpt("staging_bytes is " + std::to_string(m.opts.staging_bytes), "give the checkpoint writer at least 4096 bytes of staging memory");
  if (!(m.opts.finish_poll_seconds > 0 && m.opts.finish_poll_seconds <= 60))
    fail_ckpt("finish_poll_seconds is " + std::to_string(m.opts.finish_poll_seconds),
              "use a round of more than 0 and at most 60 seconds (well under the comm watchdog's deadline)");
  if (m.opts.chunk_bytes < 4) fail_ckpt("chunk_bytes is " + std::to_string(m.opts.chunk_bytes), "use at least 4 bytes");
  m.opts.warn = dist_io::warner(m.opts.warn);
  if (!m.opts.copy) m.opts.copy = [](void* dst, const void* src, size_t n) { std::memcpy(dst, src, n); };
  m.chunk_bytes = std::min(m.opts.chunk_bytes, m.opts.staging_bytes) / 4 * 4;
  m.max_buffers = size_t(m.opts.staging_bytes / m.chunk_bytes);
  if (const char* d = std::getenv("ZAYA_CKPT_TEST_WRITE_DELAY_MS"))
    m.test_delay_ms = std::max(0, std::atoi(d));
  for (int i = 0; i < m.opts.writer_threads; ++i) m.threads.emplace_back([&m] { m.writer_loop(); });
}

DistCheckpointWriter::~DistCheckpointWriter() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lk(m.mu);
    m.stopping = true;  // queued chunks are skipped, not written
    if (m.job) m.set_error(*m.job, "the checkpoint writer was destroyed before the save was committed");
  }
  m.work_cv.notify_all();
  for (auto& t : m.threads) t.join();
  if (m.job && m.job->fd >= 0) ::close(m.job->fd);  // a job whose last chunk was never queued
}

bool DistCheckpointWriter::pending() const { return impl_->job != nullptr; }
const DistSaveStats& DistCheckpointWriter::last_committed() const { return impl_->last; }
const DistWriterOptions& DistCheckpointWriter::options() const { return impl_->opts; }

// ---------------------------------------------------------------------------------------------
// begin_save

namespace {

// Problems with this rank's pieces that need no other rank to see; "" when fine.
std::string check_local_pieces(const std::vector<DistPiece>& pieces) {
  std::set<std::pair<std::string, uint64_t>> seen;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const DistPiece& p = pieces[i];
    const std::string who = "piece " + std::to_string(i) + " ('" + p.name + "'): ";
    if (p.name.empty()) return who + "the tensor name is empty";
    if (!dm::valid_group(p.group)) return who + "group '" + p.group + "' is not 1-64 characters of [A-Za-z0-9_-]";
    uint64_t numel = 0;
    if (!dm::shape_numel(p.shape, &numel)) return who + "invalid shape " + dm::shape_text(p.shape);
    if (p.offset > numel || p.length > numel - p.offset)
      return who + "elements [" + std::to_string(p.offset) + ", " + std::to_string(p.offset + p.length) +
             ") lie outside the tensor's " + std::to_string(numel) + " elements";
    if (p.length > 0 && p.data == nullptr) return who + "no data pointer";
  }
  return "";
}

}  // namespace

DistSaveStats DistCheckpointWriter::begin_save(const std::string& root, int64_t step,
                                               const std::vector<DistPiece>& pieces, const nlohmann::json& meta) {
  Impl& m = *impl_;
  if (m.job) finish();
  const auto t0 = Clock::now();
  const int rank = m.comm.rank();
  const int world = m.comm.size();

  // 1. Local checks, agreed by every rank.
  std::string err;
  if (step < 0) err = "cannot save step " + std::to_string(step) + ": steps must be non-negative";
  else if (root.empty()) err = "cannot save: the checkpoint root directory is empty";
  else err = check_local_pieces(pieces);
  std::string meta_text;
  if (err.empty() && rank == 0) {
    try {
      meta_text = meta.dump();
    } catch (const nlohmann::json::exception& e) {
      err = "cannot save step " + std::to_string(step) + ": meta is not serializable: " + e.what();
    }
  }
  err = dist_agree::first_error(m.comm, err);
  if (!err.empty()) fail_ckpt(err);

  // 2. The piece layout of this rank's file, and the tiling over all ranks (every rank checks
  //    the same gathered tables, so all reach the same verdict).
  auto job = std::make_shared<DistJob>();
  job->step = step;
  job->root = root;
  job->tmp_name = std::string(dist_io::kTmpPrefix) + dist_io::step_dir_name(step);
  job->tmp_dir = dist_io::join(root, job->tmp_name);
  job->file_name = dist_io::rank_file_name(rank);
  job->path = dist_io::join(job->tmp_dir, job->file_name);
  job->meta = rank == 0 ? meta : nlohmann::json();
  job->start = t0;
  job->stats.step = step;
  job->stats.world_size = world;
  dm::RankTable table;
  table.rank = rank;
  for (const DistPiece& p : pieces) {
    LocalPiece lp;
    lp.name = p.name;
    lp.shape = p.shape;
    lp.group = p.group;
    lp.offset = p.offset;
    lp.length = p.length;
    lp.file_offset = job->bytes;
    job->bytes += p.length * 4;
    table.entries.push_back({p.name, p.shape, p.group, {rank, p.offset, p.length, job->file_name, lp.file_offset, 0}});
    job->pieces.push_back(std::move(lp));
  }
  {
    std::vector<dm::RankTable> tables;
    const auto texts = dist_agree::all_gather_strings(m.comm, dm::table_to_text(table));
    for (int r = 0; r < world; ++r) tables.push_back(dm::table_from_text(texts[size_t(r)], r));
    std::vector<dm::TensorRecord> tensors;
    err = dm::assemble(tables, &tensors);
    if (!err.empty()) fail_ckpt("cannot save step " + std::to_string(step) + " to " + root + ": " + err);
  }

  // 3. Rank 0 prepares the shared temporary directory (removing crashed saves first, which
  //    may take a while: the others wait in short rounds).
  std::function<std::string()> prepare;
  if (rank == 0)
    prepare = [&]() -> std::string {
      dist_io::test_disk_delay();  // a slow disk, in tests (rank 0's temporary directory)
      dist_io::create_root(root);
      dist_io::remove_tmp_entries(root, "", m.opts.warn);
      if (::mkdir(job->tmp_dir.c_str(), 0755) != 0)
        return job->tmp_dir + ": cannot create: " + dist_io::errno_text();
      return "";
    };
  err = dist_agree::agree_after_disk_work(m.comm, m.opts.finish_poll_seconds, prepare);
  if (!err.empty()) fail_ckpt(err);

  // 4. Every rank creates its file and reserves its size (a full disk fails here, early; a
  //    file system without fallocate writes the zeros, so this too may be slow).
  err = dist_agree::agree_after_disk_work(m.comm, m.opts.finish_poll_seconds, [&]() -> std::string {
    if (rank == world - 1) dist_io::test_disk_delay();  // the last rank's file creation
    job->fd = ::open(job->path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (job->fd < 0) return job->path + ": cannot create: " + dist_io::errno_text();
    if (job->bytes > 0) {
      int rc = ::posix_fallocate(job->fd, 0, off_t(job->bytes));
      if (rc != 0 && rc != EOPNOTSUPP && rc != EINVAL)
        return job->path + ": cannot reserve " + std::to_string(job->bytes) + " bytes: " + std::strerror(rc);
    }
    return "";
  });
  if (!err.empty()) {
    if (job->fd >= 0) ::close(job->fd);
    if (rank == 0) {
      std::error_code ec;
      fs::remove_all(job->tmp_dir, ec);
    }
    fail_ckpt(err);
  }

  // 5. Stage every piece in chunks; writer threads take them from the queue.
  m.job = job;
  for (size_t i = 0; i < pieces.size(); ++i) {
    LocalPiece& lp = job->pieces[i];
    const uint64_t bytes = lp.length * 4;
    const size_t n_chunks = size_t((bytes + m.chunk_bytes - 1) / m.chunk_bytes);
    lp.chunk_crcs.assign(n_chunks, 0);
    lp.chunk_sizes.assign(n_chunks, 0);
    for (size_t c = 0; c < n_chunks; ++c) lp.chunk_sizes[c] = std::min(m.chunk_bytes, bytes - c * m.chunk_bytes);
  }
  bool stop = false;
  for (size_t i = 0; i < pieces.size() && !stop; ++i) {
    LocalPiece& lp = job->pieces[i];
    for (size_t c = 0; c < lp.chunk_sizes.size() && !stop; ++c) {
      StagedChunk ch;
      ch.job = job;
      ch.piece = i;
      ch.index = c;
      ch.file_offset = lp.file_offset + c * m.chunk_bytes;
      ch.bytes = lp.chunk_sizes[c];
      ch.buf = m.take_buffer();
      std::string copy_err;
      try {
        m.opts.copy(ch.buf.get(), reinterpret_cast<const char*>(pieces[i].data) + c * m.chunk_bytes, size_t(ch.bytes));
      } catch (const std::exception& e) {
        copy_err = "copying tensor '" + lp.name + "' to the staging buffer failed: " + e.what();
      }
      {
        std::lock_guard<std::mutex> lk(m.mu);
        if (!copy_err.empty()) m.set_error(*job, copy_err);
        if (!job->error.empty()) {  // a failed save: stop staging, the commit will fail
          m.free_buffers.push_back(std::move(ch.buf));
          --m.buffers_in_use;
          stop = true;
          break;
        }
        ++job->outstanding;
        m.queue.push_back(std::move(ch));
      }
      m.work_cv.notify_one();
    }
  }
  bool finalize_here = false;
  {
    std::lock_guard<std::mutex> lk(m.mu);
    job->all_queued = true;
    finalize_here = job->outstanding == 0;
  }
  if (finalize_here) m.finalize(*job);
  job->stats.bytes = job->bytes;
  job->stats.begin_seconds = seconds_since(t0);
  return job->stats;
}

// ---------------------------------------------------------------------------------------------
// poll / finish / commit

void DistCheckpointWriter::Impl::discard_job() {
  // Only called once every rank has stopped writing (after an agreement collective).
  if (comm.rank() == 0) {
    std::error_code ec;
    fs::remove_all(job->tmp_dir, ec);
  }
  job.reset();
}

void DistCheckpointWriter::Impl::fail_job(const std::string& message) {
  discard_job();
  fail_ckpt(message, "the previous checkpoints are untouched");
}

std::optional<DistSaveStats> DistCheckpointWriter::Impl::poll() {
  if (!job) return std::nullopt;
  enum { kFailed = 0, kWriting = 1, kDone = 2 };
  int local = kWriting;
  {
    std::lock_guard<std::mutex> lk(mu);
    if (!job->error.empty()) local = kFailed;
    else if (job->done) local = kDone;
  }
  const int global = dist_agree::all_reduce_min(comm, local);
  if (global == kWriting) return std::nullopt;
  if (opts.before_commit) opts.before_commit();
  if (global == kFailed) {
    // Stop this rank's writers for the job, and wait until every rank's file is closed (a
    // write or fsync under way may take long: the ranks meet in short rounds meanwhile).
    bool mine = false;
    {
      std::lock_guard<std::mutex> lk(mu);
      mine = !job->error.empty();
      if (!mine) job->error = "another rank failed";  // makes the writers skip the rest
    }
    for (;;) {
      bool closed = false;
      {
        std::unique_lock<std::mutex> lk(mu);
        closed = done_cv.wait_for(lk, std::chrono::duration<double>(opts.finish_poll_seconds),
                                  [&] { return job->done; });
      }
      if (dist_agree::all_reduce_min(comm, closed ? 1 : 0) == 1) break;
    }
    std::string my_err;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (mine) my_err = job->error;
    }
    std::string err = dist_agree::first_error(comm, my_err);
    fail_job("checkpoint save of step " + std::to_string(job->step) + " failed: " +
             (err.empty() ? "unknown error" : err));
  }
  return commit();
}

DistSaveStats DistCheckpointWriter::Impl::commit() {
  DistJob& j = *job;
  const int rank = comm.rank();
  const int world = comm.size();
  dm::RankTable table;
  table.rank = rank;
  uint32_t file_crc = 0;
  for (const LocalPiece& lp : j.pieces) {
    uint32_t crc = 0;
    for (size_t c = 0; c < lp.chunk_crcs.size(); ++c) crc = crc32c_combine(crc, lp.chunk_crcs[c], lp.chunk_sizes[c]);
    file_crc = crc32c_combine(file_crc, crc, lp.length * 4);
    table.entries.push_back({lp.name, lp.shape, lp.group, {rank, lp.offset, lp.length, j.file_name, lp.file_offset, crc}});
  }
  table.files.push_back({j.file_name, rank, j.bytes, file_crc});
  const auto texts = dist_agree::all_gather_strings(comm, dm::table_to_text(table));

  std::string err;
  const std::string final_dir = dist_io::join(j.root, dist_io::step_dir_name(j.step));
  uint64_t total_bytes = 0;
  std::vector<dm::RankTable> tables;
  try {
    for (int r = 0; r < world; ++r) tables.push_back(dm::table_from_text(texts[size_t(r)], r));
    for (const auto& t : tables)
      for (const auto& f : t.files) total_bytes += f.bytes;
  } catch (const Error& e) {
    err = e.message();
  }
  err = dist_agree::first_error(comm, err);
  if (!err.empty()) fail_job("checkpoint save of step " + std::to_string(j.step) + " failed: " + err);
  // Rank 0 commits: manifest, fsyncs, rename, prune. The other ranks wait for it in short
  // rounds (agree_after_disk_work), however long rank 0's storage takes.
  std::function<std::string()> commit_work;
  if (rank == 0)
    commit_work = [&]() -> std::string {
      dist_io::test_disk_delay();  // rank 0's commit
      const auto tc = Clock::now();
      dm::Manifest man;
      man.step = j.step;
      man.world_size = world;
      man.meta = j.meta;
      for (const auto& t : tables) man.files.insert(man.files.end(), t.files.begin(), t.files.end());
      const std::string bad_tiling = dm::assemble(tables, &man.tensors);
      if (!bad_tiling.empty()) return bad_tiling;
      dist_io::write_file_durable(dist_io::join(j.tmp_dir, dm::kManifestName), dm::format_manifest(man));
      dist_io::fsync_dir(j.tmp_dir);
      dist_io::commit_rename(j.root, j.tmp_dir, final_dir);  // the commit point
      dist_io::prune(j.root, j.step, opts.keep_last, opts.warn);
      dist_io::remove_tmp_entries(j.root, "", opts.warn);  // includes a replaced old directory
      j.stats.commit_seconds = seconds_since(tc);
      return "";
    };
  err = dist_agree::agree_after_disk_work(comm, opts.finish_poll_seconds, commit_work);
  if (!err.empty()) fail_job("checkpoint save of step " + std::to_string(j.step) + " failed: " + err);
  j.stats.write_seconds = j.write_seconds;  // done was seen under the mutex in poll()
  j.stats.committed = true;
  j.stats.dir = final_dir;
  j.stats.total_bytes = total_bytes;
  j.stats.total_seconds = seconds_since(j.start);
  DistSaveStats out = j.stats;
  last = out;
  job.reset();
  return out;
}

std::optional<DistSaveStats> DistCheckpointWriter::poll() {
  Impl& m = *impl_;
  if (!m.job) return std::nullopt;
  const auto t0 = Clock::now();
  auto job = m.job;  // keeps the stats reachable once poll() commits
  auto r = m.poll();
  if (r) {
    r->wait_seconds += seconds_since(t0);
    r->total_seconds = seconds_since(job->start);
    m.last = *r;
  } else {
    job->stats.wait_seconds += seconds_since(t0);
  }
  return r;
}

DistSaveStats DistCheckpointWriter::finish() {
  Impl& m = *impl_;
  if (!m.job) return m.last;
  const auto t0 = Clock::now();
  auto job = m.job;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(m.mu);
      m.done_cv.wait_for(lk, std::chrono::duration<double>(m.opts.finish_poll_seconds),
                         [&] { return job->done || !job->error.empty(); });
    }
    const double before = job->stats.wait_seconds;
    auto r = m.poll();
    if (r) {
      r->wait_seconds = before + seconds_since(t0);
      r->total_seconds = seconds_since(job->start);
      m.last = *r;
      return *r;
    }
  }
}

}  // namespace zaya
