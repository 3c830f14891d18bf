// Heartbeats: every training rank records where it is (phase and step) in a small file of its
// own, so that a supervisor (`zaya launch`, supervisor.h) can tell a job that is making progress
// from one that hangs, whatever the cause (a stuck collective, I/O, a stopped process).
//
//   <dir>/rank-00003.json
//   {"rank":3,"world":4,"pid":1234,"host":"node01","phase":"step","step":120,"total_steps":1000,"time":1763900000.25}
//
// Each beat is written to a temporary name and renamed over the file, so a reader never sees a
// torn record. The supervisor judges staleness by when it saw a record change (its own clock),
// not by the "time" field, so clocks of different nodes need not agree.
// Phases: "start" (entered train(); loading, resuming), "step" (a step finished), "eval",
// "checkpoint" (around the parts of a save that block training and may wait on the disk: its
// start, which first waits for the previous save, and the commit of a written save; also before
// a rollback reloads the last checkpoint; "step" follows each), "final" (exporting the model and
// a sample), "done".
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace zaya {

// The environment variable through which a supervisor hands the heartbeat directory to a job.
constexpr const char* kHeartbeatDirEnv = "ZAYA_HEARTBEAT_DIR";

struct HeartbeatRecord {
  int rank = 0;
  int world = 1;
  int64_t pid = 0;
  std::string host;
  std::string phase;
  int64_t step = 0;
  int64_t total_steps = 0;
  double time = 0;  // seconds since the epoch on the writer's clock (informational)
};

// The file of one rank's heartbeat under dir.
std::string heartbeat_path(const std::string& dir, int rank);

class HeartbeatWriter {
 public:
  // dir "" turns heartbeats off (every beat is then a no-op).
  HeartbeatWriter(std::string dir, int rank, int world);
  bool enabled() const { return !dir_.empty(); }
  // Records (phase, step). A failure to write warns once on stderr and never throws: training
  // must not stop because its heartbeat could not be written.
  void beat(const std::string& phase, int64_t step, int64_t total_steps);

 private:
  std::string dir_;
  int rank_, world_;
  bool warned_ = false;
};

// The records found under dir, ordered by rank. Files that are missing, partial or not a
// heartbeat are skipped (a rank may be writing its first beat).
std::vector<HeartbeatRecord> read_heartbeats(const std::string& dir);

// Removes every rank-*.json heartbeat (and leftover temporaries) under dir; creates dir.
void reset_heartbeat_dir(const std::string& dir);

}  // namespace zaya
