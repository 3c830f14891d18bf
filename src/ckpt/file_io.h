// Durable file-system primitives shared by both checkpoint formats (checkpoint.cpp, format
// version 1, and the sharded src/ckpt/dist_*, version 2): checked writes and reads, fsync of
// files and directories, checkpoint directory names, and the commit, pruning and removal steps
// that never leave a damaged step-* directory behind. Internal to src/ckpt; every failure
// throws zaya::Error("checkpoint", ...) naming the path.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "ckpt/checkpoint.h"

namespace zaya::ckpt_io {

constexpr const char* kComponent = "checkpoint";
constexpr const char* kTmpPrefix = ".tmp-";

[[noreturn]] void fail_ckpt(const std::string& message, const std::string& hint = {});
std::string errno_text();
std::string join(const std::string& dir, const std::string& name);

// "step-00000123" (8 digits minimum).
std::string step_dir_name(int64_t step);
// "step-<digits>" -> step; false for anything else.
bool parse_step_dir_name(const std::string& name, int64_t* step);

// Writes all n bytes at `offset` (pwrite; safe from several threads on one descriptor).
void pwrite_all(int fd, const void* data, size_t n, uint64_t offset, const std::string& path);
// Reads up to n bytes at offset; returns the count read.
size_t pread_some(int fd, void* buf, size_t n, uint64_t offset);
void fsync_file(int fd, const std::string& path);
// Creates `path` holding `text`, fsynced before returning.
void write_file_durable(const std::string& path, const std::string& text);
// fsync of a directory (tolerates file systems that do not support it).
void fsync_dir(const std::string& dir);
// Reads a whole small file (at most 1 GiB); false (with *error set, e.g. "missing") when it
// cannot.
bool read_small_file(const std::string& path, std::string* text, std::string* error);

// Creates the checkpoint root (and makes its name durable, best effort).
void create_root(const std::string& root);
// Removes every .tmp-* entry of root except `keep` (crashed or abandoned saves).
void remove_tmp_entries(const std::string& root, const std::string& keep, const CheckpointWarn& warn);
// Renames root/name to a .tmp-delete-* name, then removes that tree.
void remove_dir_safely(const std::string& root, const std::string& name, const CheckpointWarn& warn);
// Renames tmp (a complete checkpoint) to final_dir; an existing final_dir is swapped out
// atomically (RENAME_EXCHANGE) or moved aside first. fsyncs root afterwards.
void commit_rename(const std::string& root, const std::string& tmp, const std::string& final_dir);
// Keeps the keep_last highest steps (and always `just_saved`); keep_last <= 0 keeps all.
// Warns when checkpoints of later steps than just_saved exist.
void prune(const std::string& root, int64_t just_saved, int keep_last, const CheckpointWarn& warn);

// w, or a warning printed to stderr when w is empty.
CheckpointWarn warner(const CheckpointWarn& w);

}  // namespace zaya::ckpt_io
