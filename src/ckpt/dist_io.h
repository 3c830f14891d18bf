// File-system helpers of the sharded (format version 2) checkpoint writer, reader and
// reshaper: the rank data file name, and the durable primitives both formats share
// (ckpt/file_io.h), named here so src/ckpt/dist_* can keep writing dist_io::. Internal to
// src/ckpt/dist_*.
#pragma once
#include <string>

#include "ckpt/file_io.h"

namespace zaya::dist_io {

using ckpt_io::kTmpPrefix;

using ckpt_io::errno_text;
using ckpt_io::fail_ckpt;
using ckpt_io::join;
using ckpt_io::step_dir_name;

using ckpt_io::fsync_dir;
using ckpt_io::fsync_file;
using ckpt_io::pwrite_all;
using ckpt_io::read_small_file;
using ckpt_io::write_file_durable;

using ckpt_io::commit_rename;
using ckpt_io::create_root;
using ckpt_io::prune;
using ckpt_io::remove_tmp_entries;
using ckpt_io::warner;

// "rank-00003.bin": the data file of one rank.
std::string rank_file_name(int rank);

// Test hook: the milliseconds that rank-local disk work between collectives sleeps first, as
// on slow storage (environment ZAYA_CKPT_TEST_DISK_DELAY_MS; 0 when unset). Read once.
int test_disk_delay_ms();
// Sleeps test_disk_delay_ms() when it is positive.
void test_disk_delay();

}  // namespace zaya::dist_io
