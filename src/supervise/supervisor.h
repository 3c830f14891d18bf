// The fault-tolerance supervisor behind `zaya launch` (spec D.7: a minimal Aegis-like service).
// It runs a training job, watches it, and restarts it when it fails; the job resumes by itself
// from its latest valid checkpoint (bit-exactly), so a failure costs only the steps since then.
//
// Failures detected:
//   * the job exits non-zero: a rank crashed (killed by a signal), failed with an error, or the
//     communication watchdog ended it (status 86: a collective timed out; 87: ranks issued
//     different collectives);
//   * the job hangs: a rank's heartbeat (heartbeat.h) has not changed for heartbeat_timeout_s
//     (startup_timeout_s before its first beat and while it loads or exports;
//     checkpoint_timeout_s while a checkpoint blocks it: the start of a save, the commit, a
//     rollback's reload). Whatever the
//     cause (a stuck collective, I/O, a stopped process), the job's whole process group gets
//     SIGTERM, then SIGKILL after kill_grace_s. A quiet rank on this host whose process has
//     begun to exit (process_state.h) gets one more heartbeat_timeout_s to end first, so a rank
//     killed while a thread finished an fsync is reported as killed, not as hung.
// With a preflight command (`zaya doctor`: GEMM burn-in and an all-reduce on every rank), each
// attempt starts only after the health check passes.
// Policy: restart after restart_delay_s, at most max_restarts times; give up when
// max_attempts_without_progress attempts in a row failed without a new committed checkpoint
// (a failure that repeats deterministically, a bad input, a full disk), so a broken job is never
// restarted forever. Status 87 (ranks disagree on the collectives: a bug) is never restarted.
// SIGINT, SIGTERM or SIGHUP to the supervisor stop the job and supervision.
// Every decision is printed and appended as one JSON line to events_path.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace zaya {

struct SupervisorOptions {
  std::vector<std::string> command;  // the job's argv; argv[0] is a path or a name on PATH
  // A health check run to its end before every attempt (e.g. mpirun ... zaya doctor); a
  // failure counts as a failed attempt without progress and the job is not started. Empty: none.
  std::vector<std::string> preflight_command;
  double preflight_timeout_s = 600;
  std::string heartbeat_dir;   // handed to the job as ZAYA_HEARTBEAT_DIR; cleared per attempt
  std::string checkpoint_dir;  // progress = a newer step-* checkpoint committed here
  std::string events_path;     // JSON lines appended per event ("" = none)
  int expected_ranks = 1;      // ranks that must beat (the job's world size)
  int max_restarts = 10;
  int max_attempts_without_progress = 3;
  double heartbeat_timeout_s = 600;
  double startup_timeout_s = 1800;
  // Limit for the "checkpoint" phase (heartbeat.h): a save can wait for the previous one's files
  // to reach the disk, and fsync on shared or busy storage can take far longer than a step.
  double checkpoint_timeout_s = 1800;
  double restart_delay_s = 5;
  double kill_grace_s = 10;
  double poll_interval_s = 0.5;
  std::function<void(const std::string&)> log;  // human-readable lines; default: stderr
};

struct SupervisorResult {
  int exit_code = 0;         // 0 finished; 1 gave up; 128 + signal when stopped by a signal
  int attempts = 0;          // times the job was started
  int restarts = 0;          // attempts - 1
  std::string outcome;       // "finished", "gave_up" or "stopped"
  std::string last_failure;  // the last failure's description ("" if none)
};

// Runs the job until it finishes, supervision gives up, or the supervisor is signalled.
// Throws zaya::Error only when the job cannot be started at all (no such program).
SupervisorResult supervise(const SupervisorOptions& options);

// "exited with status 86: a collective timed out (comm watchdog)", "was killed by signal 9 (Killed)".
std::string describe_wait_status(int status);

// The highest step-* checkpoint committed under root; -1 when there is none.
int64_t latest_checkpoint_step(const std::string& root);

}  // namespace zaya
