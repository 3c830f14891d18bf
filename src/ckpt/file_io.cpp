// Durable file-system primitives of both checkpoint formats (see file_io.h).
#include "ckpt/file_io.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/error.h"

namespace fs = std::filesystem;

namespace zaya::ckpt_io {

void fail_ckpt(const std::string& message, const std::string& hint) { fail(kComponent, message, hint); }

std::string errno_text() { return std::strerror(errno); }

std::string join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

std::string step_dir_name(int64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "step-%08lld", (long long)step);
  return buf;
}

bool parse_step_dir_name(const std::string& name, int64_t* step) {
  if (name.size() <= 5 || name.compare(0, 5, "step-") != 0 || name.size() > 5 + 18) return false;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    v = v * 10 + (name[i] - '0');
  }
  *step = v;
  return true;
}

void pwrite_all(int fd, const void* data, size_t n, uint64_t offset, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, n, off_t(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail_ckpt(path + ": write failed at byte " + std::to_string(offset) + ": " + errno_text());
    }
    if (w == 0) fail_ckpt(path + ": short write at byte " + std::to_string(offset));
    p += w;
    n -= size_t(w);
    offset += uint64_t(w);
  }
}

size_t pread_some(int fd, void* buf, size_t n, uint64_t offset) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::pread(fd, static_cast<char*>(buf) + got, n - got, off_t(offset + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      return got;
    }
    if (r == 0) break;
    got += size_t(r);
  }
  return got;
}

void fsync_file(int fd, const std::string& path) {
  if (::fsync(fd) != 0) fail_ckpt(path + ": fsync failed: " + errno_text());
}

void write_file_durable(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_ckpt(path + ": cannot create: " + errno_text());
  try {
    pwrite_all(fd, text.data(), text.size(), 0, path);
    fsync_file(fd, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) fail_ckpt(path + ": close failed: " + errno_text());
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_ckpt(dir + ": cannot open directory to fsync: " + errno_text());
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems do not support fsync on directories; their renames are durable anyway.
  if (rc != 0 && err != EINVAL && err != ENOTSUP)
    fail_ckpt(dir + ": fsync of the directory failed: " + std::strerror(err));
}

bool read_small_file(const std::string& path, std::string* text, std::string* error) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *error = errno == ENOENT ? std::string("missing") : "cannot open: " + errno_text();
    return false;
  }
  text->clear();
  char buf[65536];
  for (;;) {
    ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      *error = "read failed: " + errno_text();
      ::close(fd);
      return false;
    }
    if (r == 0) break;
    text->append(buf, size_t(r));
    if (text->size() > (size_t(1) << 30)) {
      *error = "larger than 1 GiB";
      ::close(fd);
      return false;
    }
  }
  ::close(fd);
  return true;
}

void create_root(const std::string& root) {
  if (root.empty()) fail_ckpt("the checkpoint root directory is empty");
  std::error_code ec;
  if (fs::create_directories(root, ec)) {
    std::error_code aec;
    fs::path abs = fs::absolute(root, aec).lexically_normal();
    if (!abs.has_filename()) abs = abs.parent_path();
    int pfd = ::open(abs.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (pfd >= 0) {
      ::fsync(pfd);
      ::close(pfd);
    }
  }
  if (ec || !fs::is_directory(root, ec))
    fail_ckpt(root + ": cannot create the checkpoint root" + (ec ? ": " + ec.message() : std::string()));
}

void remove_tmp_entries(const std::string& root, const std::string& keep, const CheckpointWarn& warn) {
  std::error_code ec;
  fs::directory_iterator it(root, ec), end;
  if (ec) return;
  std::vector<fs::path> stale;
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    std::string name = it->path().filename().string();
    if (name.rfind(kTmpPrefix, 0) == 0 && name != keep) stale.push_back(it->path());
  }
  for (const auto& p : stale) {
    std::error_code rec;
    fs::remove_all(p, rec);
    if (rec) warn("cannot remove stale " + p.string() + ": " + rec.message());
  }
}

void remove_dir_safely(const std::string& root, const std::string& name, const CheckpointWarn& warn) {
  const std::string from = join(root, name);
  const std::string doomed = join(root, std::string(kTmpPrefix) + "delete-" + name + "-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(doomed, ec);
  if (::rename(from.c_str(), doomed.c_str()) != 0) {
    warn("cannot remove old checkpoint " + from + ": rename failed: " + errno_text());
    return;
  }
  fs::remove_all(doomed, ec);
  if (ec) warn("cannot fully remove " + doomed + ": " + ec.message());
}

void commit_rename(const std::string& root, const std::string& tmp, const std::string& final_dir) {
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    if (errno != ENOTEMPTY && errno != EEXIST) fail_ckpt("cannot rename " + tmp + " to " + final_dir + ": " + errno_text());
    // The same step was saved before: swap atomically, the old one then lies under tmp's name.
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0) {
      const std::string aside = join(root, std::string(kTmpPrefix) + "replaced-" +
                                               fs::path(final_dir).filename().string() + "-" + std::to_string(::getpid()));
      std::error_code ec;
      fs::remove_all(aside, ec);
      if (::rename(final_dir.c_str(), aside.c_str()) != 0)
        fail_ckpt("cannot move the existing " + final_dir + " aside: " + errno_text());
      if (::rename(tmp.c_str(), final_dir.c_str()) != 0)
        fail_ckpt("cannot rename " + tmp + " to " + final_dir + ": " + errno_text());
    }
  }
  fsync_dir(root);
}

void prune(const std::string& root, int64_t just_saved, int keep_last, const CheckpointWarn& warn) {
  const auto all = list_checkpoints(root);  // highest step first
  std::vector<std::string> newer;
  for (const auto& c : all)
    if (c.step > just_saved) newer.push_back(fs::path(c.dir).filename().string());
  if (!newer.empty())
    warn("saved step " + std::to_string(just_saved) + ", but " + root + " holds checkpoints of later steps (" +
         newer.front() + (newer.size() > 1 ? ", ..." : "") + "); loading the latest will try those first");
  if (keep_last <= 0) return;
  for (size_t i = size_t(keep_last); i < all.size(); ++i)
    if (all[i].step != just_saved) remove_dir_safely(root, fs::path(all[i].dir).filename().string(), warn);
}

CheckpointWarn warner(const CheckpointWarn& w) {
  if (w) return w;
  return [](const std::string& msg) { std::fprintf(stderr, "zaya: warning: %s\n", msg.c_str()); };
}

}  // namespace zaya::ckpt_io
