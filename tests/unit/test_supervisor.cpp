// The fault-tolerance supervisor (src/supervise/): heartbeat files, and the restart policy run
// against small shell jobs that crash, hang, stall or finish. tests/supervise/ runs `zaya
// launch` on real training jobs.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "dist/comm.h"
#include "supervise/health_check.h"
#include "supervise/heartbeat.h"
#include "supervise/process_state.h"
#include "supervise/supervisor.h"
#include "test_helpers.h"

namespace zaya {
namespace {

namespace fs = std::filesystem;

// The "event" values of an events file, in order.
std::vector<std::string> event_names(const std::string& path) {
  std::vector<std::string> names;
  std::istringstream lines(test::read_file(path));
  for (std::string line; std::getline(lines, line);) {
    const auto at = line.find("\"event\":\"");
    if (at == std::string::npos) continue;
    const auto from = at + 9;
    names.push_back(line.substr(from, line.find('"', from) - from));
  }
  return names;
}

// Whether pid still runs: a zombie (killed, not yet reaped by whoever adopted it) does not.
// A killed process takes a moment to die, so this waits up to two seconds for it.
bool process_alive(pid_t pid) {
  for (int i = 0; i < 100; ++i) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const auto paren = text.rfind(')');
    if (!stat || paren == std::string::npos || paren + 2 >= text.size() || text[paren + 2] == 'Z')
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// Options for a shell job whose script sees $D (a scratch dir) and $ZAYA_HEARTBEAT_DIR.
SupervisorOptions shell_job(const std::string& dir, const std::string& script) {
  SupervisorOptions o;
  o.command = {"/bin/sh", "-c", "D=" + dir + "; " + script};
  o.heartbeat_dir = dir + "/heartbeat";
  o.checkpoint_dir = dir + "/checkpoints";
  o.events_path = dir + "/events.jsonl";
  o.restart_delay_s = 0;
  o.kill_grace_s = 1;
  o.poll_interval_s = 0.02;
  o.heartbeat_timeout_s = 30;
  o.startup_timeout_s = 30;
  o.log = [](const std::string&) {};
  return o;
}

// A shell line that records one heartbeat of rank 0 in phase P at step S.
std::string beat(const std::string& phase, int step) {
  return "printf '{\"rank\":0,\"world\":1,\"pid\":%d,\"host\":\"h\",\"phase\":\"" + phase +
         "\",\"step\":" + std::to_string(step) +
         ",\"total_steps\":9,\"time\":%s}' $$ $(date +%s.%N) > \"$ZAYA_HEARTBEAT_DIR/t\" && "
         "mv \"$ZAYA_HEARTBEAT_DIR/t\" \"$ZAYA_HEARTBEAT_DIR/rank-00000.json\"; ";
}

TEST(Heartbeat, WriteReadAndReset) {
  const std::string dir = test::fresh_dir("supervise", "hb");
  HeartbeatWriter off("", 0, 1);
  EXPECT_FALSE(off.enabled());
  off.beat("step", 1, 2);  // a no-op
  HeartbeatWriter r1(dir, 1, 2), r0(dir, 0, 2);
  r1.beat("step", 7, 100);
  r0.beat("start", 0, 100);
  r0.beat("checkpoint", 5, 100);
  std::ofstream(dir + "/rank-00002.json") << "{\"rank\":2,";      // torn: skipped
  std::ofstream(dir + "/rank-00003.json") << "{\"rank\":\"x\"}";  // not a heartbeat: skipped
  const auto recs = read_heartbeats(dir);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].rank, 0);
  EXPECT_EQ(recs[0].phase, "checkpoint");
  EXPECT_EQ(recs[0].step, 5);
  EXPECT_EQ(recs[0].world, 2);
  EXPECT_EQ(recs[0].pid, int64_t(getpid()));
  EXPECT_EQ(recs[1].rank, 1);
  EXPECT_EQ(recs[1].phase, "step");
  EXPECT_EQ(recs[1].step, 7);
  EXPECT_EQ(recs[1].total_steps, 100);
  EXPECT_GT(recs[1].time, 1.6e9);
  EXPECT_EQ(heartbeat_path(dir, 1), dir + "/rank-00001.json");
  reset_heartbeat_dir(dir);
  EXPECT_TRUE(read_heartbeats(dir).empty());
  EXPECT_FALSE(fs::exists(dir + "/rank-00002.json"));
}

TEST(Supervisor, DescribesExitStatuses) {
  EXPECT_EQ(describe_wait_status(0), "exited normally");
  EXPECT_EQ(describe_wait_status(3 << 8), "exited with status 3");
  EXPECT_NE(describe_wait_status(86 << 8).find("a collective timed out"), std::string::npos);
  EXPECT_NE(describe_wait_status(87 << 8).find("different collectives"), std::string::npos);
  EXPECT_NE(describe_wait_status(SIGKILL).find("signal 9"), std::string::npos);
  EXPECT_NE(describe_wait_status(137 << 8).find("killed by signal 9"), std::string::npos);
}

TEST(Supervisor, FinishedJobIsNotRestarted) {
  const std::string dir = test::fresh_dir("supervise", "ok");
  const SupervisorResult r = supervise(shell_job(dir, "test -d \"$ZAYA_HEARTBEAT_DIR\" || exit 4; exit 0"));
  EXPECT_EQ(r.outcome, "finished");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.attempts, 1);
  EXPECT_EQ(event_names(dir + "/events.jsonl"), (std::vector<std::string>{"start", "finished"}));
}

TEST(Supervisor, CrashedJobIsRestartedAndFinishes) {
  const std::string dir = test::fresh_dir("supervise", "crash");
  const SupervisorResult r =
      supervise(shell_job(dir, "if [ -e $D/once ]; then exit 0; fi; touch $D/once; kill -9 $$"));
  EXPECT_EQ(r.outcome, "finished");
  EXPECT_EQ(r.attempts, 2);
  EXPECT_EQ(r.restarts, 1);
  EXPECT_NE(r.last_failure.find("killed by signal 9"), std::string::npos) << r.last_failure;
  EXPECT_EQ(event_names(dir + "/events.jsonl"),
            (std::vector<std::string>{"start", "failure", "restart", "start", "finished"}));
}

TEST(Supervisor, NothingOfAFailedJobLingers) {
  // The job's leader exits with an error and leaves a child behind (as mpirun can leave a rank).
  const std::string dir = test::fresh_dir("supervise", "orphan");
  SupervisorOptions o = shell_job(dir, "sleep 60 & echo $! > $D/sleeper; exit 3");
  o.max_attempts_without_progress = 1;
  const SupervisorResult r = supervise(o);
  EXPECT_EQ(r.outcome, "gave_up");
  EXPECT_FALSE(process_alive(pid_t(std::stol(test::read_file(dir + "/sleeper")))));
}

TEST(Supervisor, GivesUpOnAFailureThatMakesNoProgress) {
  const std::string dir = test::fresh_dir("supervise", "stuck");
  SupervisorOptions o = shell_job(dir, "echo run >> $D/runs; exit 3");
  o.max_attempts_without_progress = 3;
  const SupervisorResult r = supervise(o);
  EXPECT_EQ(r.outcome, "gave_up");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.attempts, 3);
  EXPECT_EQ(test::read_file(dir + "/runs"), "run\nrun\nrun\n");
  EXPECT_EQ(r.last_failure, "exited with status 3");
  EXPECT_EQ(event_names(dir + "/events.jsonl").back(), "gave_up");
}

TEST(Supervisor, MismatchedCollectivesAreNotRestarted) {
  const std::string dir = test::fresh_dir("supervise", "mismatch");
  const SupervisorResult r = supervise(shell_job(dir, "mkdir -p $D/checkpoints/step-00000001; exit 87"));
  EXPECT_EQ(r.outcome, "gave_up");
  EXPECT_EQ(r.attempts, 1);
  EXPECT_NE(r.last_failure.find("different collectives"), std::string::npos) << r.last_failure;
}

TEST(Supervisor, NewCheckpointsCountAsProgress) {
  // Every attempt commits a new checkpoint and then fails, until the fifth finishes: with at
  // most 2 attempts without progress the job must still get to finish.
  const std::string dir = test::fresh_dir("supervise", "progress");
  SupervisorOptions o = shell_job(dir,
                                  "echo x >> $D/n; n=$(wc -l < $D/n); [ $n -ge 5 ] && exit 0; "
                                  "mkdir -p $D/checkpoints/step-0000000$n; exit 3");
  o.max_attempts_without_progress = 2;
  const SupervisorResult r = supervise(o);
  EXPECT_EQ(r.outcome, "finished");
  EXPECT_EQ(r.attempts, 5);
  EXPECT_EQ(latest_checkpoint_step(dir + "/checkpoints"), 4);
}

TEST(Supervisor, StopsAfterMaxRestarts) {
  const std::string dir = test::fresh_dir("supervise", "maxrestarts");
  SupervisorOptions o =
      shell_job(dir, "echo x >> $D/n; mkdir -p $D/checkpoints/step-0000000$(wc -l < $D/n); exit 5");
  o.max_restarts = 2;
  const SupervisorResult r = supervise(o);
  EXPECT_EQ(r.outcome, "gave_up");
  EXPECT_EQ(r.attempts, 3);
  EXPECT_EQ(r.restarts, 2);
}

TEST(Supervisor, HungJobIsKilledWithItsProcessGroupAndRestarted) {
  const std::string dir = test::fresh_dir("supervise", "hang");
  // The first attempt beats once, then hangs in a child process (recorded in $D/sleeper).
  SupervisorOptions o = shell_job(dir, "if [ -e $D/once ]; then exit 0; fi; touch $D/once; " +
                                           beat("step", 3) + "sleep 60 & echo $! > $D/sleeper; wait");
  o.heartbeat_timeout_s = 0.5;
  const auto t0 = std::chrono::steady_clock::now();
  const SupervisorResult r = supervise(o);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.outcome, "finished");
  EXPECT_EQ(r.attempts, 2);
  EXPECT_NE(r.last_failure.find("rank 0"), std::string::npos) << r.last_failure;
  EXPECT_NE(r.last_failure.find("at step 3"), std::string::npos) << r.last_failure;
  EXPECT_LT(took, 20.0);
  const pid_t sleeper = pid_t(std::stol(test::read_file(dir + "/sleeper")));
  EXPECT_FALSE(process_alive(sleeper)) << "the hung job's child survived";
  EXPECT_EQ(event_names(dir + "/events.jsonl"),
            (std::vector<std::string>{"start", "hang", "restart", "start", "finished"}));
}

TEST(Supervisor, RankThatIsAlreadyExitingIsNotCalledHung) {
  // A rank killed while one of its threads finishes an fsync beats no more and cannot be reaped
  // for a while. Its stand-in (exiting_job): the main thread ends after one beat, and a second
  // thread ends the process with status 3 after 2 s, past the 1.5 s heartbeat timeout.
  const std::string dir = test::fresh_dir("supervise", "exiting");
  SupervisorOptions o = shell_job(
      dir, std::string("if [ -e $D/once ]; then exit 0; fi; touch $D/once; exec ") + ZAYA_EXITING_JOB + " 2");
  o.heartbeat_timeout_s = 1.5;
  const SupervisorResult r = supervise(o);
  EXPECT_EQ(r.outcome, "finished");
  EXPECT_EQ(r.attempts, 2);
  EXPECT_NE(r.last_failure.find("exited with status 3"), std::string::npos) << r.last_failure;
  EXPECT_EQ(event_names(dir + "/events.jsonl"),
            (std::vector<std::string>{"start", "failure", "restart", "start", "finished"}));
}

TEST(Supervisor, RankThatTakesTooLongToExitIsCalledHung) {
  // The grace for an exiting rank is one more heartbeat timeout, not forever.
  const std::string dir = test::fresh_dir("supervise", "exiting_slowly");
  SupervisorOptions o =
      shell_job(dir, std::string("if [ -e $D/once ]; then exit 0; fi; touch $D/once; exec ") +
                         ZAYA_EXITING_JOB + " 30");
  o.heartbeat_timeout_s = 0.3;
  const auto t0 = std::chrono::steady_clock::now();
  const SupervisorResult r = supervise(o);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.outcome, "finished");
  EXPECT_NE(r.last_failure.find("has not beaten for"), std::string::npos) << r.last_failure;
  EXPECT_LT(took, 20.0);
  EXPECT_EQ(event_names(dir + "/events.jsonl"),
            (std::vector<std::string>{"start", "hang", "restart", "start", "finished"}));
}

TEST(ProcessState, RunningAndMissingProcessesAreNotExiting) {
  EXPECT_FALSE(process_is_exiting(::getpid()));
  EXPECT_FALSE(process_is_exiting(0));
  EXPECT_FALSE(process_is_exiting(-5));
  EXPECT_FALSE(process_is_exiting(4194304 + 17));  // above Linux's largest pid
}

TEST(Supervisor, JobWithoutAnyHeartbeatHitsTheStartupTimeout) {
  const std::string dir = test::fresh_dir("supervise", "silent");
  SupervisorOptions o = shell_job(dir, "exec sleep 60");
  o.startup_timeout_s = 0.5;
  o.max_attempts_without_progress = 1;
  const SupervisorResult r = supervise(o);
  EXPECT_EQ(r.outcome, "gave_up");
  EXPECT_NE(r.last_failure.find("sent no heartbeat"), std::string::npos) << r.last_failure;
}

TEST(Supervisor, SlowPhasesGetTheStartupTimeout) {
  // Loading ("start") may take longer than a step; only the startup timeout applies to it.
  const std::string dir = test::fresh_dir("supervise", "slowstart");
  SupervisorOptions o = shell_job(dir, beat("start", 0) + "sleep 1.5; " + beat("step", 1) + "exit 0");
  o.heartbeat_timeout_s = 0.3;
  o.startup_timeout_s = 10;
  o.max_attempts_without_progress = 1;
  const SupervisorResult r = supervise(o);
  EXPECT_EQ(r.outcome, "finished") << r.last_failure;
  EXPECT_EQ(r.attempts, 1);
}

TEST(Supervisor, CheckpointPhaseGetsTheCheckpointTimeout) {
  // A save may wait for the previous save's fsync; only the checkpoint timeout applies to it.
  const std::string dir = test::fresh_dir("supervise", "slowckpt");
  SupervisorOptions o =
      shell_job(dir, beat("step", 1) + beat("checkpoint", 1) + "sleep 4; " + beat("step", 2) + "exit 0");
  o.heartbeat_timeout_s = 1;  // room for the shell to start and beat on a loaded machine
  o.startup_timeout_s = 2;
  o.checkpoint_timeout_s = 30;
  o.max_attempts_without_progress = 1;
  const SupervisorResult r = supervise(o);
  EXPECT_EQ(r.outcome, "finished") << r.last_failure;
  EXPECT_EQ(r.attempts, 1);
}

TEST(Supervisor, CheckpointPhasePastItsTimeoutIsAHang) {
  const std::string dir = test::fresh_dir("supervise", "stuckckpt");
  SupervisorOptions o = shell_job(dir, beat("step", 1) + beat("checkpoint", 1) + "exec sleep 60");
  o.heartbeat_timeout_s = 30;
  o.checkpoint_timeout_s = 0.5;
  o.max_attempts_without_progress = 1;
  const SupervisorResult r = supervise(o);
  EXPECT_EQ(r.outcome, "gave_up");
  EXPECT_EQ(r.attempts, 1);
  EXPECT_NE(r.last_failure.find("last beat: \"checkpoint\" at step 1; --checkpoint-timeout 0.5"),
            std::string::npos)
      << r.last_failure;
}

TEST(Supervisor, StopSignalStopsTheJobWithoutRestart) {
  const std::string dir = test::fresh_dir("supervise", "sigterm");
  SupervisorOptions o = shell_job(dir, "sleep 60 & echo $! > $D/sleeper; wait");
  std::thread signaller([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    kill(getpid(), SIGTERM);
  });
  const SupervisorResult r = supervise(o);
  signaller.join();
  EXPECT_EQ(r.outcome, "stopped");
  EXPECT_EQ(r.exit_code, 128 + SIGTERM);
  EXPECT_EQ(r.attempts, 1);
  const pid_t sleeper = pid_t(std::stol(test::read_file(dir + "/sleeper")));
  EXPECT_FALSE(process_alive(sleeper));
  // The handler is gone again: SIGTERM's disposition is back to what it was.
  struct sigaction now {};
  sigaction(SIGTERM, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);
}

TEST(Supervisor, MissingProgramIsAnError) {
  const std::string dir = test::fresh_dir("supervise", "missing");
  SupervisorOptions o = shell_job(dir, "");
  o.command = {dir + "/no-such-program"};
  EXPECT_THROW(supervise(o), Error);
}

TEST(Supervisor, FailedPreflightKeepsTheJobFromStarting) {
  const std::string dir = test::fresh_dir("supervise", "preflight_bad");
  SupervisorOptions o = shell_job(dir, "touch $D/job_ran; exit 0");
  o.preflight_command = {"/bin/sh", "-c", "echo x >> " + dir + "/checks; exit 1"};
  const SupervisorResult r = supervise(o);
  EXPECT_EQ(r.outcome, "gave_up");
  EXPECT_EQ(r.attempts, 3);
  EXPECT_FALSE(fs::exists(dir + "/job_ran"));
  EXPECT_EQ(test::read_file(dir + "/checks"), "x\nx\nx\n");
  EXPECT_NE(r.last_failure.find("preflight: the health check exited with status 1"), std::string::npos)
      << r.last_failure;
}

TEST(Supervisor, PassedPreflightStartsTheJob) {
  const std::string dir = test::fresh_dir("supervise", "preflight_ok");
  SupervisorOptions o = shell_job(dir, "exit 0");
  o.preflight_command = {"/bin/sh", "-c", "exit 0"};
  const SupervisorResult r = supervise(o);
  EXPECT_EQ(r.outcome, "finished");
  EXPECT_EQ(event_names(dir + "/events.jsonl"), (std::vector<std::string>{"preflight", "start", "finished"}));
}

TEST(Supervisor, HungPreflightIsKilled) {
  const std::string dir = test::fresh_dir("supervise", "preflight_hang");
  SupervisorOptions o = shell_job(dir, "exit 0");
  o.preflight_command = {"/bin/sh", "-c",
                         "if [ -e " + dir + "/once ]; then exit 0; fi; touch " + dir + "/once; sleep 60"};
  o.preflight_timeout_s = 0.5;
  const SupervisorResult r = supervise(o);
  EXPECT_EQ(r.outcome, "finished");
  EXPECT_EQ(r.attempts, 2);
  EXPECT_NE(r.last_failure.find("did not finish within"), std::string::npos) << r.last_failure;
}

// y = x w^T on the host, optionally made wrong or unstable, for the health check.
class HostGemm : public HealthGemm {
 public:
  float scale = 1;          // multiplies every result (1.001: wrong results)
  int unstable_after = -1;  // from this run on, one element changes slightly
  void load(const float* x, const float* w, int64_t n) override {
    x_.assign(x, x + n * n);
    w_.assign(w, w + n * n);
    n_ = n;
    y_.assign(size_t(n * n), 0);
  }
  void run() override {
    for (int64_t i = 0; i < n_; ++i)
      for (int64_t j = 0; j < n_; ++j) {
        float acc = 0;
        for (int64_t k = 0; k < n_; ++k) acc += x_[size_t(i * n_ + k)] * w_[size_t(j * n_ + k)];
        y_[size_t(i * n_ + j)] = acc * scale;
      }
    if (unstable_after >= 0 && runs_ >= unstable_after) y_[7] = std::nextafter(y_[7], 1e30f);
    ++runs_;
  }
  void read(float* y) override { std::copy(y_.begin(), y_.end(), y); }

 private:
  std::vector<float> x_, w_, y_;
  int64_t n_ = 0;
  int runs_ = 0;
};

HealthCheckOptions small_check() {
  HealthCheckOptions o;
  o.gemm_size = 48;
  o.burn_in_seconds = 0.05;
  o.allreduce_bytes = 4096;
  return o;
}

TEST(HealthCheck, HealthyRankPasses) {
  HostGemm gemm;
  auto comm = make_single_comm();
  const HealthReport r = run_health_check(gemm, *comm, small_check());
  ASSERT_EQ(r.ranks.size(), 1u);
  EXPECT_TRUE(r.ok()) << r.table();
  EXPECT_TRUE(r.ranks[0].gemm_ok);
  EXPECT_TRUE(r.ranks[0].repeat_ok);
  EXPECT_TRUE(r.ranks[0].allreduce_ok);
  EXPECT_GT(r.ranks[0].gemm_gflops, 0);
  EXPECT_LT(r.ranks[0].gemm_max_error, 1e-5);
  EXPECT_NE(r.table().find("ok"), std::string::npos);
}

TEST(HealthCheck, WrongGemmResultsFail) {
  HostGemm gemm;
  gemm.scale = 1.001f;
  auto comm = make_single_comm();
  const HealthReport r = run_health_check(gemm, *comm, small_check());
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(r.ranks[0].gemm_ok);
  EXPECT_GT(r.ranks[0].gemm_max_error, 5e-4);
  EXPECT_NE(r.table().find("FAILED: wrong GEMM results"), std::string::npos) << r.table();
}

TEST(HealthCheck, UnstableGemmFails) {
  HostGemm gemm;
  gemm.unstable_after = 3;
  auto comm = make_single_comm();
  const HealthReport r = run_health_check(gemm, *comm, small_check());
  EXPECT_TRUE(r.ranks[0].gemm_ok);
  EXPECT_FALSE(r.ranks[0].repeat_ok);
  EXPECT_FALSE(r.ok());
}

TEST(HealthCheck, SlowRanksAreFlagged) {
  HealthReport r;
  for (double rate : {100.0, 95.0, 40.0, 110.0}) {
    RankHealth h;
    h.rank = int(r.ranks.size());
    h.gemm_gflops = rate;
    h.gemm_ok = h.repeat_ok = h.allreduce_ok = true;
    r.ranks.push_back(h);
  }
  flag_slow_ranks(r, 0.5);  // median 97.5: the threshold is 48.75
  EXPECT_FALSE(r.ranks[0].slow);
  EXPECT_FALSE(r.ranks[1].slow);
  EXPECT_TRUE(r.ranks[2].slow);
  EXPECT_FALSE(r.ranks[3].slow);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.table().find("GEMM rate below"), std::string::npos);
}

}  // namespace
}  // namespace zaya
